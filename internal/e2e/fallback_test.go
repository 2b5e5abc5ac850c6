package e2e

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// A second CA (issue #19): the tests run two Pebbles, each with its own accounts and
// orders, validating HTTP-01 against the world's responder. The first is usually
// behind a Front, which makes it go down or rate-limit; the world's CA (w.ca) is the
// first unless a test says otherwise.

// fallbackAfter is --acme-fallback-after in these tests: long against a claim and the
// CA's first backoff (2 s), short against a test's patience.
const fallbackAfter = 2 * time.Second

// startSecondCA starts another Pebble that validates against the world's responder,
// and returns it with an issuer configuration for it.
func (w *world) startSecondCA(t testing.TB) (*pebbletest.CA, acme.Config) {
	t.Helper()
	return w.startSecondCAWith(t, pebbletest.Options{})
}

// startSecondCAWith is startSecondCA with opts (its HTTP port is the world's).
func (w *world) startSecondCAWith(t testing.TB, opts pebbletest.Options) (*pebbletest.CA, acme.Config) {
	t.Helper()
	opts.HTTPPort = w.ca.HTTPPort
	ca := pebbletest.StartT(t, opts)
	roots := filepath.Join(t.TempDir(), "second-roots.pem")
	require.NoError(t, os.WriteFile(roots, ca.RootsPEM(), 0o600))
	return ca, acme.Config{
		DirectoryURL: ca.DirectoryURL,
		Email:        "ops@e2e.example",
		CABundle:     roots,
		Profile:      pebbletest.DefaultProfile,
		HTTPTimeout:  10 * time.Second,
	}
}

// startWithFallback starts an instance whose first CA is first and second CA second,
// as `certworker run` wires them with --acme-fallback-directory.
func (w *world) startWithFallback(t testing.TB, name string, first, second acme.Config, cfg worker.Config) *workertest.Instance {
	t.Helper()
	pool, err := queue.NewPool(w.ctx, w.dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	first.Recorder = queue.New(pool, issuing.DefaultConfig())
	second.Recorder = first.Recorder
	issuer, err := acme.New(w.ctx, pool, zap.NewNop(), first)
	require.NoError(t, err)
	fb, err := acme.New(w.ctx, pool, zap.NewNop(), second)
	require.NoError(t, err)
	cfg.Issuer = issuer
	cfg.Directory = issuer.DirectoryURL()
	after := fallbackAfter
	if cfg.Fallback != nil && cfg.Fallback.After != 0 {
		after = cfg.Fallback.After
	}
	cfg.Fallback = &worker.FallbackCA{Issuer: fb, Directory: fb.DirectoryURL(), After: after, Limits: cfg.Limits}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = 30 * time.Second
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = time.Second
	}
	return workertest.Start(t, w.dsn, name, cfg)
}

// issuedBy is the issuing CA's directory recorded with domain's certificate, "" for none.
func (w *world) issuedBy(t testing.TB, domain string) string {
	t.Helper()
	var dir *string
	err := w.pool.QueryRow(w.ctx, `SELECT issuer_directory FROM proxy_certificates WHERE domain = $1`, domain).Scan(&dir)
	if err != nil || dir == nil {
		return ""
	}
	return *dir
}

// The first CA is down: a domain verified then is issued by the second within
// --acme-fallback-after and one order, nothing charged to it, and the log says why.
func TestE2E_AFirstCADownSendsANewDomainToTheSecond(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	front := pebbletest.NewFront(t, w.ca)
	first := w.acmeConfig()
	first.DirectoryURL = front.DirectoryURL
	second, secondCfg := w.startSecondCA(t)
	in := w.startWithFallback(t, "a", first, secondCfg, worker.Config{Concurrency: 2,
		Queue: issuing.Config{RetryBase: 200 * time.Millisecond, RetryMax: time.Minute}})

	front.SetDown(true)
	name := randomName("down")
	verified := time.Now()
	id := w.addDomains(t, name)[0]
	s := startStateSampler(w, 20*time.Millisecond)
	waitFor(t, fallbackAfter+30*time.Second, "the domain to be issued", func() bool { return w.domain(t, id).Status == "active" })
	took := time.Since(verified)
	states, err := s.stop()
	require.NoError(t, err)

	require.GreaterOrEqual(t, took, fallbackAfter, "the second CA was asked before --acme-fallback-after")
	require.Less(t, took, fallbackAfter+15*time.Second)
	require.Equal(t, second.DirectoryURL, w.issuedBy(t, name))
	require.Len(t, ordersFor(second, name), 1)
	require.Empty(t, ordersFor(w.ca, name))
	require.Zero(t, states[id].maxAttempts, "the first CA's outage was charged to the domain")
	require.Empty(t, states[id].errors)
	require.Equal(t, 1.0, in.Metric(t, "certworker_fallback_decisions_total", issuing.FallbackOutage))
	// The order is counted once it has ended, after the row's write and the ledger's.
	in.WaitForMetric(t, 1, 10*time.Second, "certworker_ca_orders_total", "fallback", "issued")
	logs := in.Logs.FilterMessage("asking the second CA").All()
	require.Len(t, logs, 1)
	require.Equal(t, issuing.FallbackOutage, logs[0].ContextMap()["cause"])
	t.Logf("issued by the second CA %s after verification (--acme-fallback-after %s)", took.Round(time.Millisecond), fallbackAfter)
}

// With the first CA down from the start, a new domain goes to the second within a few
// seconds of --acme-fallback-after, whatever the poll: the worker's timer is set for
// the moment the hold reaches it, and a hand-back at each end of the first's doubling
// outage pause does not start the wait again. It took 63 s with 10 s and a 30 s poll,
// and 48.6 s with 15 s and a 5 s poll: the hold was measured from the last hand-back,
// and the timer was not set for it.
func TestE2E_AFirstCADownSendsANewDomainToTheSecondSoonAfterTheWait(t *testing.T) {
	t.Parallel()
	const after = 10 * time.Second
	w := newWorld(t, pebbletest.Options{})
	front := pebbletest.NewFront(t, w.ca)
	first := w.acmeConfig()
	first.DirectoryURL = front.DirectoryURL
	second, secondCfg := w.startSecondCA(t)
	front.SetDown(true)
	w.startWithFallback(t, "a", first, secondCfg, worker.Config{Concurrency: 2, PollInterval: 30 * time.Second,
		Fallback: &worker.FallbackCA{After: after}})

	name := randomName("soon")
	verified := time.Now()
	id := w.addDomains(t, name)[0]
	waitFor(t, after+60*time.Second, "the domain to be issued", func() bool { return w.domain(t, id).Status == "active" })
	took := time.Since(verified)
	require.Equal(t, second.DirectoryURL, w.issuedBy(t, name))
	require.GreaterOrEqual(t, took, after, "the second CA was asked before --acme-fallback-after")
	require.Less(t, took, after+8*time.Second, "the second CA was asked long after --acme-fallback-after")
	t.Logf("issued by the second CA %s after verification (--acme-fallback-after %s, --poll-interval 30s)", took.Round(time.Millisecond), after)
}

// A rate-limit pause of a registered domain at the first CA sends its names to the
// second after the wait; other tenants' names still go to the first. Two instances
// share each decision: no name is ordered at both CAs, nor twice.
func TestE2E_ARateLimitAtTheFirstCASendsItsNamesToTheSecondOnly(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	front := pebbletest.NewFront(t, w.ca)
	first := w.acmeConfig()
	first.DirectoryURL = front.DirectoryURL
	second, secondCfg := w.startSecondCA(t)
	rd := "shop-" + randomHex() + ".example"
	limited := []string{"a." + rd, "b." + rd, "c." + rd}
	free := []string{randomName("other"), randomName("other"), randomName("other")}
	front.Add(pebbletest.Rule{Step: pebbletest.StepNewOrder, Names: limited[:1],
		Answer: pebbletest.RateLimitedRegisteredDomain(limited[0], time.Hour)})
	cfg := worker.Config{Concurrency: 2}
	a := w.startWithFallback(t, "a", first, secondCfg, cfg)
	b := w.startWithFallback(t, "b", first, secondCfg, cfg)

	start := time.Now()
	w.addDomains(t, limited[0])
	waitFor(t, 30*time.Second, "the first CA's rate limit to be recorded", func() bool {
		var n int
		require.NoError(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM certworker_pauses WHERE scope = 'registered_domain' AND key = $1 AND directory = $2`,
			rd, front.DirectoryURL).Scan(&n))
		return n == 1
	})
	ids := w.addDomains(t, append(append([]string{}, limited[1:]...), free...)...)
	ids = append([]string{""}, ids...)
	waitFor(t, fallbackAfter+45*time.Second, "every name to be issued", func() bool {
		return w.statuses(t)["active"] == len(limited)+len(free)
	})
	require.GreaterOrEqual(t, time.Since(start), fallbackAfter)
	for _, n := range limited {
		require.Equal(t, second.DirectoryURL, w.issuedBy(t, n), "%s", n)
		require.Len(t, ordersFor(second, n), 1, "%s ordered at the second CA more than once", n)
		require.Empty(t, ordersFor(w.ca, n), "%s ordered at both CAs", n)
	}
	for _, n := range free {
		require.Equal(t, front.DirectoryURL, w.issuedBy(t, n), "%s: another tenant's name left the first CA", n)
		require.Len(t, ordersFor(w.ca, n), 1, "%s", n)
		require.Empty(t, ordersFor(second, n), "%s ordered at both CAs", n)
	}
	require.Equal(t, 1, front.Answered()[pebbletest.StepNewOrder], "a limited name was ordered again at the first CA while paused")
	decisions := a.Metric(t, "certworker_fallback_decisions_total", issuing.FallbackRateLimit) +
		b.Metric(t, "certworker_fallback_decisions_total", issuing.FallbackRateLimit)
	require.Equal(t, float64(len(limited)), decisions, "one decision per limited name, across the instances")
	for _, id := range ids[1:] {
		require.Zero(t, w.domain(t, id).Attempts)
	}
}

// A failed validation at the first CA is the tenant's (DNS, the proxy): it would fail
// at any CA, so it is charged and retried at the first, and the second is never
// asked. The first CA here validates against a port nothing listens on.
func TestE2E_AValidationFailureAtTheFirstCAIsNotRetriedAtTheSecond(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	dead := pebbletest.StartT(t, pebbletest.Options{HTTPPort: freePort(t)})
	roots := filepath.Join(t.TempDir(), "dead-roots.pem")
	require.NoError(t, os.WriteFile(roots, dead.RootsPEM(), 0o600))
	first := w.acmeConfig()
	first.DirectoryURL, first.CABundle = dead.DirectoryURL, roots
	in := w.startWithFallback(t, "a", first, w.acmeConfig(), worker.Config{Concurrency: 1,
		Queue: issuing.Config{RetryBase: 500 * time.Millisecond, RetryMax: time.Second, MaxAttempts: 3}})

	name := randomName("invalid")
	id := w.addDomains(t, name)[0]
	waitFor(t, 60*time.Second, "the domain to give up at the first CA", func() bool { return w.domain(t, id).Status == "failed" })
	require.Len(t, ordersFor(dead, name), 3, "three attempts, all at the first CA")
	require.Empty(t, ordersFor(w.ca, name), "a validation failure was retried at the second CA")
	require.Zero(t, in.Metric(t, "certworker_ca_orders_total", "fallback", "issued"))
	require.Zero(t, in.Logs.FilterMessage("asking the second CA").Len())
}

// The first CA refuses the name for good (rejectedIdentifier): the second is asked at
// once, not charged; a name both refuse fails, naming both.
func TestE2E_ANameTheFirstCARefusesGoesToTheSecondAtOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	front := pebbletest.NewFront(t, w.ca)
	first := w.acmeConfig()
	first.DirectoryURL = front.DirectoryURL
	second, secondCfg := w.startSecondCA(t)
	refused, both := randomName("refused"), randomName("both")
	front.Add(pebbletest.Rule{Step: pebbletest.StepNewOrder, Names: []string{refused, both}, Answer: pebbletest.RejectedIdentifier(refused)})
	require.NoError(t, second.BlockName(both))
	in := w.startWithFallback(t, "a", first, secondCfg, worker.Config{Concurrency: 2,
		Fallback: &worker.FallbackCA{After: time.Hour}})

	ids := w.addDomains(t, refused, both)
	waitFor(t, 30*time.Second, "the refused name to be issued by the second CA", func() bool { return w.domain(t, ids[0]).Status == "active" })
	require.Equal(t, second.DirectoryURL, w.issuedBy(t, refused))
	require.Zero(t, w.domain(t, ids[0]).Attempts)

	waitFor(t, 30*time.Second, "the name both refuse to fail", func() bool { return w.domain(t, ids[1]).Status == "failed" })
	d := w.domain(t, ids[1])
	require.NotNil(t, d.Error)
	require.Contains(t, *d.Error, "the first CA ("+front.DirectoryURL+") refused the name before")
	require.Equal(t, 2.0, in.Metric(t, "certworker_fallback_decisions_total", issuing.FallbackRefused))
	// Each name asked of the first CA once: counted as that order ends, after its writes.
	in.WaitForMetric(t, 2, 10*time.Second, "certworker_ca_orders_total", "primary", "refused_first")
	require.Len(t, ordersFor(second, refused), 1)
}

// Once the first CA is back, a certificate of the second is renewed by the first at
// its renewal time, as a new order (no "replaces": the certificate is not the first
// CA's), which brings the fleet back to its primary.
func TestE2E_TheSecondCAsCertificateIsRenewedByTheFirstOnceItIsBack(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	front := pebbletest.NewFront(t, w.ca)
	first := w.acmeConfig()
	first.DirectoryURL = front.DirectoryURL
	second, secondCfg := w.startSecondCA(t)
	in := w.startWithFallback(t, "a", first, secondCfg, worker.Config{Concurrency: 2,
		Queue:  issuing.Config{RetryBase: 200 * time.Millisecond, RetryMax: time.Minute},
		Limits: issuing.Limits{OrdersPerAccount: issuing.Limit{Count: 100, Window: time.Hour}}})

	front.SetDown(true)
	name := randomName("back")
	id := w.addDomains(t, name)[0]
	waitFor(t, fallbackAfter+30*time.Second, "the second CA's certificate", func() bool { return w.domain(t, id).Status == "active" })
	require.Equal(t, second.DirectoryURL, w.issuedBy(t, name))

	front.SetDown(false)
	// The first CA is back once its pause for the outage has ended (its backoff runs
	// out; orders are fast enough now to reach the renewal before it does).
	waitFor(t, 60*time.Second, "the first CA's pause to end", func() bool {
		var n int
		require.NoError(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM certworker_pauses
            WHERE scope = 'ca' AND key = $1 AND paused_until > now()`, front.DirectoryURL).Scan(&n))
		return n == 0
	})
	// Its renewal time comes.
	_, err := w.pool.Exec(w.ctx, `UPDATE proxy_certificates SET renew_at = now() WHERE domain = $1`, name)
	require.NoError(t, err)
	waitFor(t, 60*time.Second, "the first CA's renewal", func() bool { return w.issuedBy(t, name) == front.DirectoryURL })
	renewals := ordersFor(w.ca, name)
	require.Len(t, renewals, 1)
	require.Empty(t, renewals[0].Replaces, "the renewal named a certificate of another CA in replaces")
	require.Equal(t, 1, w.ca.OrderRequests(), "the first CA was sent an order it refused (one naming another CA's certificate)")
	require.Zero(t, in.Logs.FilterMessage("CA refused the order naming the certificate it replaces; ordering without").Len())
	require.Len(t, ordersFor(second, name), 1, "the second CA was asked again")
	require.Equal(t, "active", w.domain(t, id).Status)
	// The first CA's ledger counts it as a new order, not as a renewal.
	// The ledger settles a moment after the row turns active.
	var renewal *bool
	waitFor(t, 10*time.Second, "the first CA's ledger to count the order", func() bool {
		err := w.pool.QueryRow(w.ctx, `
SELECT renewal FROM certworker_ledger WHERE directory = $1 AND name = $2 AND outcome = 'issued'`,
			front.DirectoryURL, name).Scan(&renewal)
		return err == nil
	})
	require.False(t, *renewal, "the first CA's ledger counted a certificate of the second's as a renewal")
}

// The first CA's ledger holds a registered domain back (its limit reached): after
// --acme-fallback-after its names go to the second, whose ledger is its own.
func TestE2E_TheFirstCAsLedgerSendsANameToTheSecondAfterTheWait(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	second, secondCfg := w.startSecondCA(t)
	limits := issuing.Limits{CertsPerRegisteredDomain: issuing.Limit{Count: 1, Window: time.Hour}}
	in := w.startWithFallback(t, "a", w.acmeConfig(), secondCfg, worker.Config{Concurrency: 1, Limits: limits})

	rd := "ledger-" + randomHex() + ".example"
	ids := w.addDomains(t, "a."+rd)
	waitFor(t, 30*time.Second, "the first name", func() bool { return w.domain(t, ids[0]).Status == "active" })
	start := time.Now()
	ids = w.addDomains(t, "b."+rd)
	waitFor(t, fallbackAfter+30*time.Second, "the second name", func() bool { return w.domain(t, ids[0]).Status == "active" })
	require.GreaterOrEqual(t, time.Since(start), fallbackAfter)
	require.Equal(t, w.ca.DirectoryURL, w.issuedBy(t, "a."+rd))
	require.Equal(t, second.DirectoryURL, w.issuedBy(t, "b."+rd))
	require.Empty(t, ordersFor(w.ca, "b."+rd), "the first CA was sent an order its ledger refused")
	require.Equal(t, 1.0, in.Metric(t, "certworker_fallback_decisions_total", issuing.FallbackLedger))
}

// freePort is a loopback port nothing listens on: a CA validating against it finds
// the connection refused.
func freePort(t testing.TB) int {
	t.Helper()
	_, port, err := net.SplitHostPort(workertest.FreeAddr(t))
	require.NoError(t, err)
	n, err := strconv.Atoi(port)
	require.NoError(t, err)
	return n
}

// Two instances with the first CA down share one decision per domain: every domain is
// ordered once, at the second CA, and never at the first.
func TestE2E_TwoInstancesShareOneFallbackDecision(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	front := pebbletest.NewFront(t, w.ca)
	first := w.acmeConfig()
	first.DirectoryURL = front.DirectoryURL
	second, secondCfg := w.startSecondCA(t)
	cfg := worker.Config{Concurrency: 3, Queue: issuing.Config{RetryBase: 200 * time.Millisecond, RetryMax: time.Minute}}
	a := w.startWithFallback(t, "a", first, secondCfg, cfg)
	b := w.startWithFallback(t, "b", first, secondCfg, cfg)

	front.SetDown(true)
	names := make([]string, 8)
	for i := range names {
		names[i] = randomName("shared")
	}
	w.addDomains(t, names...)
	waitFor(t, fallbackAfter+45*time.Second, "every domain to be issued", func() bool { return w.statuses(t)["active"] == len(names) })
	for _, n := range names {
		require.Len(t, ordersFor(second, n), 1, "%s ordered at the second CA more than once", n)
		require.Empty(t, ordersFor(w.ca, n), "%s ordered at both CAs", n)
		require.Equal(t, second.DirectoryURL, w.issuedBy(t, n))
	}
	// An order is counted once it has ended, after the row's write and the ledger's:
	// the last row can be active before its order is counted.
	issued := func() float64 {
		return a.Metric(t, "certworker_ca_orders_total", "fallback", "issued") + b.Metric(t, "certworker_ca_orders_total", "fallback", "issued")
	}
	waitFor(t, 10*time.Second, "both instances to count every order", func() bool { return issued() >= float64(len(names)) })
	require.Equal(t, float64(len(names)), issued())
}

// caaStub stands in for the CAA lookup (worker.CAAFunc): names starting "first-only"
// allow the first CA, "second-only" the second, "neither" none, anything else both.
func caaStub(first, second string) worker.CAAFunc {
	return func(_ context.Context, name string) (issuing.Verdict, string, error) {
		only := func(dir, ident string) (issuing.Verdict, string, error) {
			return func(d string) bool { return d == dir }, ident, nil
		}
		switch {
		case strings.HasPrefix(name, "first-only"):
			return only(first, "first.example")
		case strings.HasPrefix(name, "second-only"):
			return only(second, "second.example")
		case strings.HasPrefix(name, "neither"):
			return only("", "elsewhere.example")
		}
		return nil, "", nil
	}
}

// The name's CAA records decide who may be asked (issue #19), given through the
// worker's CAA hook (the lookup itself is acme's): a name they allow at the first CA
// only waits for the first while it is down and is never sent to the second; one they
// allow at the second only goes there at once, the first never asked; one they allow
// at neither fails at once, naming what they allow, nothing ordered anywhere.
func TestE2E_CAADecidesWhichCAIsAsked(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	front := pebbletest.NewFront(t, w.ca)
	first := w.acmeConfig()
	first.DirectoryURL = front.DirectoryURL
	second, secondCfg := w.startSecondCA(t)
	w.startWithFallback(t, "a", first, secondCfg, worker.Config{Concurrency: 2,
		Queue: issuing.Config{RetryBase: 200 * time.Millisecond, RetryMax: time.Minute},
		CAA:   caaStub(front.DirectoryURL, second.DirectoryURL)})

	firstOnly, secondOnly, neither := "first-only-"+randomHex()+".example", "second-only-"+randomHex()+".example", "neither-"+randomHex()+".example"
	ids := w.addDomains(t, secondOnly, neither)
	waitFor(t, 30*time.Second, "the name only the second may issue", func() bool { return w.domain(t, ids[0]).Status == "active" })
	require.Equal(t, second.DirectoryURL, w.issuedBy(t, secondOnly))
	require.Zero(t, w.ca.OrderRequests(), "the first CA was asked for a name CAA forbids it")
	waitFor(t, 30*time.Second, "the name neither may issue to fail", func() bool { return w.domain(t, ids[1]).Status == "failed" })
	d := w.domain(t, ids[1])
	require.Contains(t, *d.Error, "caa: the name's CAA records allow elsewhere.example, and no CA certworker orders from")
	require.Empty(t, ordersFor(second, neither))

	front.SetDown(true)
	id := w.addDomains(t, firstOnly)[0]
	time.Sleep(fallbackAfter + 3*time.Second)
	// Waiting: pending, or claimed for a moment by a pass that finds the first CA still
	// paused and hands it back uncharged.
	waiting := w.domain(t, id)
	require.Contains(t, []string{"pending", "provisioning"}, waiting.Status)
	require.Zero(t, waiting.Attempts)
	require.Empty(t, ordersFor(second, firstOnly), "a name CAA allows at the first only was sent to the second")
	front.SetDown(false)
	waitFor(t, 60*time.Second, "the first CA to issue it once back", func() bool { return w.domain(t, id).Status == "active" })
	require.Equal(t, front.DirectoryURL, w.issuedBy(t, firstOnly))
}

// The second CA requires an external account binding (as Google Trust Services and
// ZeroSSL do): its account is registered with --acme-fallback-eab-kid and -hmac,
// apart from the first's, and issues when the first is down.
func TestE2E_TheSecondCAsAccountIsBoundWithItsOwnEAB(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	front := pebbletest.NewFront(t, w.ca)
	first := w.acmeConfig()
	first.DirectoryURL = front.DirectoryURL
	const kid, hmac = "fallback-kid", "zWNDZM6eQGHWpSRTPal5eIUYFTu7EajVIoguysqZ9wG44nMEtx3MUAsUDkMTQ12W"
	second, secondCfg := w.startSecondCAWith(t, pebbletest.Options{RequireEAB: true, EABKeys: map[string]string{kid: hmac}})
	secondCfg.EABKeyID, secondCfg.EABHMAC = kid, hmac
	w.startWithFallback(t, "a", first, secondCfg, worker.Config{Concurrency: 1,
		Queue: issuing.Config{RetryBase: 200 * time.Millisecond, RetryMax: time.Minute}})

	front.SetDown(true)
	name := randomName("eab")
	id := w.addDomains(t, name)[0]
	waitFor(t, fallbackAfter+30*time.Second, "the domain to be issued", func() bool { return w.domain(t, id).Status == "active" })
	require.Equal(t, second.DirectoryURL, w.issuedBy(t, name))
	var eabKid string
	require.NoError(t, w.pool.QueryRow(w.ctx, `SELECT eab_kid FROM certworker_acme_accounts WHERE directory = $1`,
		second.DirectoryURL).Scan(&eabKid))
	require.Equal(t, kid, eabKid)
	require.Equal(t, 1, second.NewAccounts())
}
