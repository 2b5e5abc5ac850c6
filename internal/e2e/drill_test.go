package e2e

import (
	"encoding/base64"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// The ledger follows the CA's exemptions, and a mass revocation is replaced at the
// CA's pace with newcomers still served (issue #18). Let's Encrypt exempts a renewal
// from every limit when it names the certificate it replaces inside the window ARI
// suggested for it ("Limit Exemptions for Renewals",
// https://letsencrypt.org/docs/rate-limits/), and any other renewal of the same name
// only from new orders per account and certificates per registered domain.

// week is the window of the limits these tests set: longer than any test.
const week = 7 * 24 * time.Hour

// serialOf is the serial number (hex) stored for name.
func (w *world) serialOf(t testing.TB, name string) string {
	t.Helper()
	var s string
	require.NoError(t, w.pool.QueryRow(w.ctx, `SELECT serial FROM proxy_certificates WHERE domain = $1`, name).Scan(&s))
	n, ok := new(big.Int).SetString(s, 16)
	require.True(t, ok, "serial %q", s)
	return n.Text(16)
}

// moveWindow has the CA suggest [start, end) as the renewal window of the
// certificate stored for name, and brings the worker's next read of it forward (the
// CA's Retry-After is hours). It returns the certificate's serial (hex).
func (w *world) moveWindow(t testing.TB, name string, start, end time.Time) string {
	t.Helper()
	serial := w.serialOf(t, name)
	n, _ := new(big.Int).SetString(serial, 16)
	require.NoError(t, w.ca.SetRenewalWindow(n, start, end))
	_, err := w.pool.Exec(w.ctx, `UPDATE proxy_certificates SET ari_next_at = now() WHERE domain = $1`, name)
	require.NoError(t, err)
	return serial
}

// replacedSerial is the serial number (hex) of the certificate an RFC 9773 id names.
func replacedSerial(t testing.TB, certID string) string {
	t.Helper()
	_, encoded, ok := strings.Cut(certID, ".")
	require.True(t, ok, "certificate id %q", certID)
	sn, err := base64.RawURLEncoding.DecodeString(encoded)
	require.NoError(t, err)
	return new(big.Int).SetBytes(sn).Text(16)
}

// A certificate whose window the CA moved to now is replaced, naming it, although
// the ledger's exact-set limit (1 a week) is spent by the certificate it replaces:
// an ARI renewal counts against no limit, and the pause that limit left on the name
// does not hold it back. Today's ledger counted it against the exact-set limit and
// held it back for the week (issue #18: none of 40 replaced in 180 s).
func TestE2E_AnARIRenewalInsideItsWindowPassesEveryLimit(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	limits := issuing.Limits{
		OrdersPerAccount:         issuing.Limit{Count: 1, Window: week},
		CertsPerRegisteredDomain: issuing.Limit{Count: 1, Window: week},
		CertsPerExactSet:         issuing.Limit{Count: 1, Window: week},
		FailedAuthzPerName:       issuing.Limit{Count: 1, Window: week},
	}
	in := w.startWorker(t, "w", w.acmeConfig(), worker.Config{Queue: fastRetry(), Concurrency: 2, PollInterval: time.Second, Limits: limits})
	name := randomName("drilled")
	id := w.addDomains(t, name)[0]
	waitFor(t, 30*time.Second, "the first certificate", func() bool { return w.domain(t, id).Status == "active" })
	// Nine tenths of the window are over: the worker renews now, well inside it.
	first := w.moveWindow(t, name, time.Now().Add(-time.Hour), time.Now().Add(2*time.Minute))
	waitFor(t, 30*time.Second, "the replacement", func() bool { return w.serialOf(t, name) != first })
	orders := ordersFor(w.ca, name)
	require.Len(t, orders, 2)
	require.Equal(t, first, replacedSerial(t, orders[1].Replaces), "the replacement names the certificate it replaces")
	var exempt, total int
	require.NoError(t, w.pool.QueryRow(w.ctx,
		`SELECT count(*) FILTER (WHERE exempt AND renewal), count(*) FROM certworker_ledger WHERE name = $1`, name).Scan(&exempt, &total))
	require.Equal(t, 1, exempt, "the replacement is recorded in the ledger, as exempt")
	require.Equal(t, 2, total)
	require.Zero(t, in.Logs.FilterMessage("order held back by the ledger: the CA would refuse it; the domain waits, not charged").Len())
}

// A renewal outside any window the CA suggested (here after its window ended) is
// exempt from new orders per account and certificates per registered domain only:
// with both limits spent by the first certificate (1 a week, which paused the whole
// account in the ledger) it is still placed, while a new name waits; and with the
// exact-set limit spent it waits too. Today's claim held the renewal back behind the
// ledger's pause of the account.
func TestE2E_ARenewalOutsideItsWindowIsExemptOnlyFromTheAccountAndRegisteredDomainLimits(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	limits := issuing.Limits{
		OrdersPerAccount:         issuing.Limit{Count: 2, Window: week},
		CertsPerRegisteredDomain: issuing.Limit{Count: 2, Window: week},
		CertsPerExactSet:         issuing.Limit{Count: 2, Window: week},
	}
	w.startWorker(t, "w", w.acmeConfig(), worker.Config{Queue: fastRetry(), Concurrency: 2, PollInterval: time.Second, Limits: limits})
	rd := "rd-" + randomHex() + ".example"
	renewed, held := "a."+rd, "b."+rd
	ids := w.addDomains(t, renewed, held)
	waitFor(t, 30*time.Second, "two certificates", func() bool { return w.statuses(t)["active"] == 2 })
	// Both account orders and both certificates of the registered domain are spent:
	// the ledger has paused the account and rd.
	var pauses int
	require.NoError(t, w.pool.QueryRow(w.ctx, `
SELECT count(*) FROM certworker_pauses WHERE source = 'ledger' AND scope IN ('ca', 'registered_domain')`).Scan(&pauses))
	require.Equal(t, 2, pauses)

	// The window of renewed's certificate ended a minute ago: renew now, not exempt
	// from the exact-set limit (1 spent of 2).
	first := w.moveWindow(t, renewed, time.Now().Add(-2*time.Minute), time.Now().Add(-time.Minute))
	newcomer := randomName("newcomer")
	newID := w.addDomains(t, newcomer)[0]
	waitFor(t, 30*time.Second, "the renewal", func() bool { return w.serialOf(t, renewed) != first })
	require.Len(t, ordersFor(w.ca, renewed), 2)
	var exempt bool
	require.NoError(t, w.pool.QueryRow(w.ctx, `
SELECT exempt FROM certworker_ledger WHERE name = $1 ORDER BY at DESC LIMIT 1`, renewed).Scan(&exempt))
	require.False(t, exempt, "a renewal after its window is not exempt from every limit")

	// The exact-set limit is spent now (2 of 2): a second renewal after the window
	// waits, as does the newcomer behind the account's limit.
	w.moveWindow(t, renewed, time.Now().Add(-2*time.Minute), time.Now().Add(-time.Minute))
	waitFor(t, 30*time.Second, "the second renewal to be held back", func() bool {
		var n int
		require.NoError(t, w.pool.QueryRow(w.ctx, `
SELECT count(*) FROM certworker_pauses WHERE source = 'ledger' AND scope = 'domain' AND key = $1`, renewed).Scan(&n))
		return n == 1 && w.domain(t, ids[0]).Status == "pending"
	})
	time.Sleep(2 * time.Second) // long enough for a wrong order to show
	require.Len(t, ordersFor(w.ca, renewed), 2, "the exact-set limit applies to a renewal outside its window")
	require.Empty(t, ordersFor(w.ca, newcomer), "the account's limit applies to a new name")
	require.Equal(t, "pending", w.domain(t, newID).Status)
	require.Zero(t, w.domain(t, ids[0]).Attempts, "held back by the ledger, not charged")
	require.Len(t, ordersFor(w.ca, held), 1)
}

// A mass revocation, rehearsed as a CA runs one: the renewal windows of 200
// certificates move to now (through the test CA's front, which also answers
// renewal information with a short Retry-After instead of Pebble's 6 hours), under
// an exact-set limit of 1 a week, while newcomers verify their domains. Every
// certificate is replaced, each order naming the certificate it replaces, and every
// newcomer is issued. Speed: 16 orders in flight, Pebble without validation sleep.
func TestE2E_AMassRevocationDrillIsReplacedWithNewcomersServed(t *testing.T) {
	t.Parallel()
	const fleet, newcomers = 200, 20
	// Renewals reuse the valid authorizations of the first certificates, so no
	// replacement order is validated. Pebble (v2.10.3) can deadlock when one fails
	// validation: its VA holds the order's lock while it reads the store, and a poll
	// of the same order holds the store's read lock while it waits for the order's,
	// so a store write arriving between them stops every request to the CA. Two CI
	// runs saw the CA answer nothing from then on. Newcomers are still validated.
	w := newWorld(t, pebbletest.Options{AuthzReuse: 100})
	front := pebbletest.NewFront(t, w.ca)
	// Hundreds of orders at once can stop Pebble for good (Front.SetOneAtATime): a
	// run on a quiet machine saw every request that reads its store go unanswered
	// from 2 minutes in, and the fleet never issued.
	front.SetOneAtATime(true)
	front.SetRenewalInfoRetryAfter(time.Second) // asked again in a minute (RFC 9773's least)
	acfg := w.acmeConfig()
	acfg.DirectoryURL = front.DirectoryURL
	acfg.RenewalInfoPerSecond = 1000
	limits := issuing.Limits{CertsPerExactSet: issuing.Limit{Count: 1, Window: week}}
	w.startWorker(t, "w", acfg, worker.Config{Queue: fastRetry(), Concurrency: 16, PollInterval: time.Second, Limits: limits,
		RenewalInfoPerSecond: 1000})
	names := make([]string, fleet)
	for i := range names {
		names[i] = fmt.Sprintf("r%03d-%s.example", i, randomHex())
	}
	w.addDomains(t, names...)
	// The fleet's first certificates, before the drill: 200 orders at once, which under
	// the rest of the package's load have taken more than two minutes (the CA's front
	// answering slowly enough to be paused as unreachable).
	waitFor(t, 4*time.Minute, "the fleet's certificates", func() bool { return w.statuses(t)["active"] == fleet })
	first := map[string]string{}
	// The orders of each name's first certificate: more than one where a validation
	// failed on the way (a loaded machine), none of them naming a certificate.
	before := map[string]int{}
	for _, n := range names {
		first[n] = w.serialOf(t, n)
		before[n] = len(ordersFor(w.ca, n))
	}
	began := time.Now()
	// Windows opened 45 minutes ago and open 5 minutes more: nine tenths over, so every
	// certificate is renewed at its next read, and its order reaches the CA inside the
	// window. Each read is at most a minute away (the front's Retry-After, clamped to
	// RFC 9773's least); the test brings them all to now, so that the whole fleet is
	// due at once beside the newcomers: the hardest case for them, and no minute waited.
	_, end := front.StartDrill(pebbletest.Drill{Opened: 45 * time.Minute, Window: 5 * time.Minute})
	_, err := w.pool.Exec(w.ctx, `UPDATE proxy_certificates SET ari_next_at = now() WHERE domain = ANY($1)`, names)
	require.NoError(t, err)
	t.Logf("drill: %d certificates, window until %s", fleet, end.Format(time.TimeOnly))

	// Newcomers verify their domains during the drill, a few at a time.
	var fresh []string
	for range 4 {
		batch := make([]string, newcomers/4)
		for i := range batch {
			batch[i] = randomName("newcomer")
		}
		w.addDomains(t, batch...)
		fresh = append(fresh, batch...)
		time.Sleep(2 * time.Second)
	}
	waitFor(t, 3*time.Minute, "every certificate replaced and every newcomer issued", func() bool {
		var replaced, issued int
		require.NoError(t, w.pool.QueryRow(w.ctx, `
SELECT count(*) FILTER (WHERE exempt), count(*) FILTER (WHERE NOT renewal AND outcome = 'issued' AND name LIKE 'newcomer-%')
FROM certworker_ledger WHERE outcome = 'issued'`).Scan(&replaced, &issued))
		return replaced == fleet && issued == newcomers
	})
	t.Logf("drill replaced %d certificates and issued %d newcomers in %s", fleet, newcomers, time.Since(began).Round(time.Second))
	// One replacement order a name, unless one failed on the way (on a loaded machine
	// the CA's validation can time out, and the domain is retried a second later):
	// every replacement names the certificate it replaces, and one of them was
	// finalized.
	retried := 0
	for _, n := range names {
		orders := ordersFor(w.ca, n)[before[n]:]
		require.GreaterOrEqual(t, len(orders), 1, "%s", n)
		require.LessOrEqual(t, len(orders), 2, "%s: more than one replacement order failed", n)
		finalized := 0
		for _, o := range orders {
			require.NotEmpty(t, o.Replaces, "%s: the replacement names the certificate it replaces", n)
			require.Equal(t, first[n], replacedSerial(t, o.Replaces), "%s", n)
			if o.Finalized {
				finalized++
			}
		}
		require.Equal(t, 1, finalized, "%s: finalized replacement orders", n)
		if len(orders) > 1 {
			retried++
		}
		require.NotEqual(t, first[n], w.serialOf(t, n), "%s", n)
	}
	t.Logf("%d of %d names needed a second replacement order", retried, len(names))
	// A newcomer's orders: one, or two where a validation failed on the way; one
	// finalized, none naming a certificate.
	for _, n := range fresh {
		orders := ordersFor(w.ca, n)
		require.LessOrEqual(t, len(orders), 2, "%s", n)
		require.Equal(t, 1, finalized(w.ca, n), "%s", n)
		for _, o := range orders {
			require.Empty(t, o.Replaces, "%s", n)
		}
	}
	require.Equal(t, fleet+newcomers, w.statuses(t)["active"])
}

// fastRetry is the queue's configuration with a backoff of a second: a renewal is
// claimed only a backoff after the domain's last attempt (its first issuance, here
// seconds before), which the default's would make these tests wait for.
func fastRetry() issuing.Config {
	c := issuing.DefaultConfig()
	c.RetryBase = time.Second
	return c
}
