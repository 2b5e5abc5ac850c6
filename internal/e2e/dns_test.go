package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/dnsresolver"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

const dnsZone = "acme.e2e-proxy.test"

// dnsWorld is a world whose names are resolved through a resolver of the test's own
// (the tenants' DNS and the public resolvers): it answers a tenant's _acme-challenge
// CNAME with the target's TXT, asked of two instances' DNS-01 listeners in turn, and
// forwards the rest to Pebble's DNS (challtestsrv). Pebble's VA and the preflight
// both ask it.
type dnsWorld struct {
	*world
	resolver *dnsresolver.Resolver
	// checkEvery is the started worker's gap between two checks of a waiting name.
	checkEvery time.Duration
}

func newDNSWorld(t *testing.T) *dnsWorld {
	t.Helper()
	r := workertest.StartResolver(t)
	w := &dnsWorld{world: newWorld(t, pebbletest.Options{DNSServer: r.Addr}), resolver: r}
	workertest.ServeZone(t, r, w.dsn, dnsZone)
	require.NoError(t, queue.New(w.pool, issuing.DefaultConfig()).RecordDNS01Zone(w.ctx, dnsZone))
	return w
}

// acmeConfig is the issuer of `run --preflight http --dns01-zone`, asking the bed's
// resolver.
func (w *dnsWorld) acmeConfig() acme.Config {
	cfg := w.world.acmeConfig()
	cfg.Preflight = acme.PreflightHTTP
	cfg.PreflightResolver = w.resolver.Addr
	cfg.PreflightAllowCIDR = "127.0.0.0/8"
	cfg.PreflightPort = w.ca.HTTPPort
	cfg.DNS01Zone = dnsZone
	return cfg
}

func (w *dnsWorld) start(t *testing.T, cfg worker.Config) *workertest.Instance {
	t.Helper()
	cfg.Wildcards = true
	if cfg.DNSWait.First == 0 {
		// A waiting name is checked every second, not every 10 s: the tests wait for
		// the check that sees a change, not for the pace (queue/worker's tests hold it).
		cfg.DNSWait.First = time.Second
	}
	w.checkEvery = cfg.DNSWait.First
	return w.startWorker(t, "dns", w.acmeConfig(), cfg)
}

// delegate points name's _acme-challenge (its base's, for a wildcard) at its target.
func (w *dnsWorld) delegate(name string) {
	w.resolver.SetCNAME("_acme-challenge."+strings.TrimPrefix(name, "*."), acme.DNS01Target(dnsZone, name))
}

// noAddress makes name not resolve until the test ends or it is cleared.
func noAddress(t *testing.T, name string) {
	t.Helper()
	require.NoError(t, pebbletest.SetNoAddress(name))
	t.Cleanup(func() { pebbletest.ClearDNS(name) })
}

// waitState is a domain's wait, as certworker_dns_state records it. Taken: a check
// is running (taken_until ahead), and Next is its lease's end, not the next check.
type waitState struct {
	Since, Next, Updated *time.Time
	Held                 *string
	Taken                bool
}

func (w *dnsWorld) wait(t *testing.T, id string) waitState {
	t.Helper()
	var s waitState
	require.NoError(t, w.pool.QueryRow(w.ctx, `
SELECT s.waiting_since, s.next_check_at, s.updated_at, d.ssl_held, COALESCE(s.taken_until > now(), false)
FROM proxy_domains d LEFT JOIN certworker_dns_state s ON s.domain_id = d.id WHERE d.id = $1`, id).
		Scan(&s.Since, &s.Next, &s.Updated, &s.Held, &s.Taken))
	return s
}

// waitingFor waits until the domain waits for its DNS, and checks what waiting means:
// pending, uncharged, out of line, ssl_error saying what was seen and what to set,
// next checked within the worker's first-hour gap, nothing sent to the CA (orders: the ones
// it had before).
func (w *dnsWorld) waitingFor(t *testing.T, id, name string, orders int, wantInError ...string) {
	t.Helper()
	waitFor(t, time.Minute, name+" waiting for DNS", func() bool {
		d := w.domain(t, id)
		return d.Error != nil && strings.HasPrefix(*d.Error, issuing.WaitingPrefix)
	})
	d := w.domain(t, id)
	require.Equal(t, "pending", d.Status)
	require.Zero(t, d.Attempts, "waiting is not charged")
	for _, s := range wantInError {
		require.Contains(t, *d.Error, s)
	}
	// Read between two checks: while one runs, next_check_at is its lease's end
	// (a busy machine runs them longer, and is more often seen in one).
	var s waitState
	waitFor(t, time.Minute, name+"'s state between two checks", func() bool { s = w.wait(t, id); return !s.Taken })
	require.NotNil(t, s.Held)
	require.Equal(t, queue.HeldDNS, *s.Held, "out of line")
	require.NotNil(t, s.Since)
	require.NotNil(t, s.Next)
	require.LessOrEqual(t, s.Next.Sub(*s.Updated), w.checkEvery, "checked again within %s in its first hour", w.checkEvery)
	require.Len(t, ordersFor(w.ca, name), orders, "nothing is sent to the CA while it waits")
}

// waitingDomain is a world with a worker and one verified domain that does not
// resolve, waiting for its DNS (waitingFor, and what its ssl_error says).
func waitingDomain(t *testing.T, prefix string, cfg worker.Config, wantInError ...string) (*dnsWorld, string, string) {
	t.Helper()
	w := newDNSWorld(t)
	name := randomName(prefix)
	noAddress(t, name)
	w.start(t, cfg)
	id := w.addDomains(t, name)[0]
	w.waitingFor(t, id, name, 0, wantInError...)
	return w, name, id
}

// active waits until the domain is active.
func (w *dnsWorld) active(t *testing.T, id string) {
	t.Helper()
	waitFor(t, 2*time.Minute, "domain active", func() bool { return w.domain(t, id).Status == "active" })
}

// The DNS move: a verified name that does not resolve waits, uncharged and out of
// line, with nothing sent to the CA; once its A record points at the proxy, the next
// DNS check (due within 10 s of the last; a second here) finds it, the HTTP probe passes and it is
// issued over HTTP-01 by the same instance's next claim, with exactly one order.
// Guards against the seed's charge-and-backoff (a name failed for good after about
// 12 hours, an hour's wait after a late move) and an order sent before the DNS moved.
func TestDNSWait_IssuedOnceItsARecordPointsHere(t *testing.T) {
	t.Parallel()
	limits := issuing.Limits{OrdersPerAccount: issuing.Limit{Count: 300, Window: 3 * time.Hour}}
	w, name, id := waitingDomain(t, "dns-move", worker.Config{Concurrency: 2, Limits: limits}, "no such name: ", " does not resolve to an address",
		"; to be issued, point ", " at this proxy's addresses, or set _acme-challenge.", " CNAME ")
	require.Contains(t, *w.domain(t, id).Error, acme.DNS01Target(dnsZone, name))

	// The claims that found it waiting count against no limit of the ledger: their
	// rows, once no longer pending (an order in flight), say nothing was sent. (The
	// wait for them looked for rows with no outcome, which the ledger never writes,
	// and so did not wait: a row still pending failed the test once in a clean-clone
	// CI run.)
	var rows, counted int
	waitFor(t, time.Minute, "the wait's ledger rows settled", func() bool {
		require.NoError(t, w.pool.QueryRow(w.ctx, `
SELECT count(*), count(*) FILTER (WHERE outcome IS DISTINCT FROM $3) FROM certworker_ledger
WHERE name = $1 AND outcome IS DISTINCT FROM $2`, name, issuing.LedgerPending, issuing.LedgerNotSent).Scan(&rows, &counted))
		return rows > 0
	})
	require.Zero(t, counted, "a wait is no order the CA counts")

	moved := time.Now()
	pebbletest.ClearDNS(name) // 127.0.0.1: the world's responder
	w.active(t, id)
	t.Logf("issued %.1fs after its A record changed ", time.Since(moved).Seconds())
	require.Len(t, ordersFor(w.ca, name), 1, "one order, after the move")
	d := w.domain(t, id)
	require.Zero(t, d.Attempts)
	require.Nil(t, d.Error)
	s := w.wait(t, id)
	require.Nil(t, s.Since, "the wait is over")
}

// A name with its _acme-challenge CNAME in place is issued over DNS-01 before its A
// record exists, by the worker; status says dns-01. Guards against a delegated name
// left waiting for an address.
func TestDNSWait_DelegatedNameIssuedBeforeItsARecordExists(t *testing.T) {
	t.Parallel()
	w := newDNSWorld(t)
	name := randomName("dns-delegated")
	noAddress(t, name)
	w.delegate(name)
	w.start(t, worker.Config{Concurrency: 2})
	id := w.addDomains(t, name)[0]
	w.active(t, id)
	st, err := queue.New(w.pool, issuing.DefaultConfig()).State(w.ctx, name)
	require.NoError(t, err)
	require.Equal(t, issuing.ChallengeDNS01, *st.Challenge)
}

// The CNAME added while the domain waits is seen by a DNS check, and the domain is
// issued over DNS-01 though its name still does not resolve. Guards against a wait
// that only an address ends.
func TestDNSWait_CNAMEAddedWhileWaiting(t *testing.T) {
	t.Parallel()
	w, name, id := waitingDomain(t, "dns-cname-late", worker.Config{Concurrency: 2})
	w.delegate(name)
	w.active(t, id)
	require.Len(t, ordersFor(w.ca, name), 1)
}

// A wildcard with its CNAME at _acme-challenge.BASE is issued by the worker for
// *.BASE; one without waits, naming the CNAME to set. Guards against a wildcard
// refused as invalid with DNS-01 on, or ordered over HTTP-01.
func TestDNSWait_WildcardIssuedWithItsCNAMEAndWaitsWithout(t *testing.T) {
	t.Parallel()
	w := newDNSWorld(t)
	with, without := "*."+randomName("wild-cname"), "*."+randomName("wild-none")
	w.delegate(with)
	w.start(t, worker.Config{Concurrency: 2})
	ids := w.addDomains(t, with, without)
	waitFor(t, 2*time.Minute, with+" active", func() bool { return w.domain(t, ids[0]).Status == "active" })
	var pemText string
	require.NoError(t, w.pool.QueryRow(w.ctx, `SELECT certificate_pem FROM proxy_certificates WHERE domain = $1`, with).Scan(&pemText))
	require.Contains(t, pemText, "BEGIN CERTIFICATE")
	base := strings.TrimPrefix(without, "*.")
	w.waitingFor(t, ids[1], without, 0, "set _acme-challenge."+base+" CNAME "+acme.DNS01Target(dnsZone, without))
}

// A domain issued over DNS-01 whose CNAME is removed before its renewal is renewed
// over HTTP-01 when its name points here, and waits otherwise, keeping its
// certificate. Guards against a renewal failed (charged) for a delegation undone.
func TestDNSWait_CNAMERemovedBeforeARenewal(t *testing.T) {
	t.Parallel()
	w := newDNSWorld(t)
	pointed, unpointed := randomName("dns-undone-http"), randomName("dns-undone-wait")
	noAddress(t, unpointed)
	w.delegate(pointed)
	w.delegate(unpointed)
	// A renewal is claimed a backoff after the first issuance: a second, not a minute.
	// The renewal time moved by hand below wakes nothing: the poll finds it.
	w.start(t, worker.Config{Concurrency: 2, Queue: fastRetry(), PollInterval: time.Second})
	ids := w.addDomains(t, pointed, unpointed)
	for _, id := range ids {
		waitFor(t, 2*time.Minute, "both active", func() bool { return w.domain(t, id).Status == "active" })
	}
	w.resolver.RemoveCNAME("_acme-challenge." + pointed)
	w.resolver.RemoveCNAME("_acme-challenge." + unpointed)
	_, err := w.pool.Exec(w.ctx, `UPDATE proxy_certificates SET renew_at = now() WHERE domain = ANY($1)`, []string{pointed, unpointed})
	require.NoError(t, err)
	waitFor(t, 2*time.Minute, pointed+" renewed", func() bool { return len(ordersFor(w.ca, pointed)) == 2 && w.domain(t, ids[0]).Status == "active" })
	st, err := queue.New(w.pool, issuing.DefaultConfig()).State(w.ctx, pointed)
	require.NoError(t, err)
	require.Equal(t, issuing.ChallengeHTTP01, *st.Challenge, "renewed over HTTP-01")
	w.waitingFor(t, ids[1], unpointed, 1)
	var certs int
	require.NoError(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM proxy_certificates WHERE domain = $1`, unpointed).Scan(&certs))
	require.Equal(t, 1, certs, "the waiting domain keeps its certificate")
}

// A retry (the proxy's, or `certworker retry`) brings a waiting domain's check
// forward: its next check an hour away, the retry has it claimed and issued at once
// once its DNS points here. Guards against a tenant who fixed the DNS and pressed
// retry waiting for a late check.
func TestDNSWait_RetryBringsTheCheckForward(t *testing.T) {
	t.Parallel()
	w, name, id := waitingDomain(t, "dns-retry", worker.Config{Concurrency: 2})
	_, err := w.pool.Exec(w.ctx, `UPDATE certworker_dns_state SET next_check_at = now() + interval '1 hour' WHERE domain_id = $1`, id)
	require.NoError(t, err)
	pebbletest.ClearDNS(name)
	_, err = w.pool.Exec(w.ctx, `SELECT * FROM certworker_queue_for_issuance($1, $2)`, id, w.tenant)
	require.NoError(t, err)
	w.active(t, id)
}

// After --dns-wait-max a waiting domain is failed, saying its DNS never pointed here,
// with nothing ever sent to the CA. Guards against a name checked forever.
func TestDNSWait_FailedAfterDNSWaitMax(t *testing.T) {
	t.Parallel()
	w := newDNSWorld(t)
	name := randomName("dns-never")
	noAddress(t, name)
	w.start(t, worker.Config{Concurrency: 2, DNSWaitMax: 3 * time.Second})
	id := w.addDomains(t, name)[0]
	waitFor(t, time.Minute, name+" failed", func() bool { return w.domain(t, id).Status == "failed" })
	d := w.domain(t, id)
	require.Contains(t, *d.Error, "waiting for DNS: its DNS never pointed here within 3s")
	require.Empty(t, ordersFor(w.ca, name))
}
