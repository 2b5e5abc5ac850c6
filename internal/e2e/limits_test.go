package e2e

import (
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// One tenant never stalls the fleet (issue #8): a CA's rateLimited answer pauses only
// what its limit covers, for every instance, and is never charged. The CA here is
// Pebble behind a Front that answers chosen new orders with Let's Encrypt's real
// texts; each case has names the limit covers and names it does not, and checks the
// first wait (never charged, never ordered again, the reason recorded) while the
// others are issued.
func TestE2E_RateLimitsPauseOnlyWhatTheyCover(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// answer is the CA's answer to the new orders of the names in limited[0].
		answer func(name string) pebbletest.Answer
		// limited are the names the limit covers: the first gets the CA's answer,
		// the others are held back by the pause without being ordered.
		limited func(rd string) []string
		free    func(rd string) []string
		scope   string
		key     func(rd string, limited []string) string
	}{
		{
			name:    "per registered domain",
			answer:  func(n string) pebbletest.Answer { return pebbletest.RateLimitedRegisteredDomain(n, time.Hour) },
			limited: func(rd string) []string { return []string{"a." + rd, "b." + rd, rd} },
			free:    func(rd string) []string { return []string{randomName("other"), "x.other-" + rd} },
			scope:   issuing.ScopeRegisteredDomain,
			key:     func(rd string, _ []string) string { return rd },
		},
		{
			name:    "per exact set",
			answer:  func(string) pebbletest.Answer { return pebbletest.RateLimitedExactSet(time.Hour) },
			limited: func(rd string) []string { return []string{"a." + rd} },
			free:    func(rd string) []string { return []string{"b." + rd, rd, randomName("other")} },
			scope:   issuing.ScopeDomain,
			key:     func(_ string, limited []string) string { return limited[0] },
		},
		{
			name:    "failed authorizations per name",
			answer:  func(n string) pebbletest.Answer { return pebbletest.RateLimitedFailedAuthorizations(n, time.Hour) },
			limited: func(rd string) []string { return []string{"a." + rd} },
			free:    func(rd string) []string { return []string{"b." + rd, randomName("other")} },
			scope:   issuing.ScopeDomain,
			key:     func(_ string, limited []string) string { return limited[0] },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, pebbletest.Options{})
			front := pebbletest.NewFront(t, w.ca)
			cfg := w.acmeConfig()
			cfg.DirectoryURL = front.DirectoryURL
			rd := "shop-" + randomHex() + ".example"
			limited, free := tc.limited(rd), tc.free(rd)
			front.Add(pebbletest.Rule{Step: pebbletest.StepNewOrder, Names: limited[:1], Answer: tc.answer(limited[0])})
			wcfg := worker.Config{Concurrency: 2, PollInterval: 30 * time.Second}
			a := w.startWorker(t, "a", cfg, wcfg)
			b := w.startWorker(t, "b", cfg, wcfg)

			// The limited name first, alone, so that its pause is in force before the
			// others are verified.
			first := w.addDomains(t, limited[0])[0]
			waitFor(t, 30*time.Second, "the CA's rate limit to be recorded", func() bool {
				var n int
				require.NoError(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM certworker_pauses WHERE scope = $1 AND key = $2`,
					tc.scope, tc.key(rd, limited)).Scan(&n))
				return n == 1
			})
			rest := w.addDomains(t, append(append([]string{}, limited[1:]...), free...)...)
			freeIDs := rest[len(limited)-1:]
			waitFor(t, 30*time.Second, "the names the limit does not cover to be issued", func() bool {
				for _, id := range freeIDs {
					if w.domain(t, id).Status != "active" {
						return false
					}
				}
				return true
			})
			// A pass over the queue after everything else was issued: the limited
			// names are still due, and still held back.
			require.NoError(t, a.Stop(t, 30*time.Second))
			for i, id := range append([]string{first}, rest[:len(limited)-1]...) {
				d := w.domain(t, id)
				require.Equal(t, "pending", d.Status, "%s", limited[i])
				require.Zero(t, d.Attempts, "%s was charged for a rate limit", limited[i])
				require.Nil(t, d.Error, "%s", limited[i])
				orders := len(ordersFor(w.ca, limited[i]))
				require.Zero(t, orders, "%s reached the CA while paused", limited[i])
			}
			require.Equal(t, 1, front.Answered()[pebbletest.StepNewOrder], "the limited name was ordered again while paused")
			require.True(t, b.Running())
		})
	}
}

// An account-wide limit (or one the worker does not recognise) pauses the whole CA
// for every instance until Retry-After; nothing is charged and everything is issued
// after it.
func TestE2E_AnAccountWideLimitPausesTheCA(t *testing.T) {
	t.Parallel()
	const retryAfter = 3 * time.Second
	w := newWorld(t, pebbletest.Options{})
	front := pebbletest.NewFront(t, w.ca)
	cfg := w.acmeConfig()
	cfg.DirectoryURL = front.DirectoryURL
	front.Add(pebbletest.Rule{Step: pebbletest.StepNewOrder, Times: 1, Answer: pebbletest.RateLimitedOrdersPerAccount(retryAfter)})
	w.startWorker(t, "a", cfg, worker.Config{Concurrency: 1, PollInterval: 30 * time.Second})
	s := startStateSampler(w, 20*time.Millisecond)
	first := w.addDomains(t, randomName("first"))[0]
	waitFor(t, 10*time.Second, "the pause", func() bool {
		var n int
		require.NoError(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM certworker_pauses WHERE scope = 'ca'`).Scan(&n))
		return n == 1
	})
	paused := time.Now()
	others := w.addDomains(t, randomName("other"), randomName("other"))
	waitFor(t, 30*time.Second, "all three to be issued", func() bool { return w.statuses(t)["active"] == 3 })
	states, err := s.stop()
	require.NoError(t, err)
	for _, id := range append(others, first) {
		require.Zero(t, states[id].maxAttempts, "charged for the CA's limit")
	}
	require.GreaterOrEqual(t, w.ca.OrderRequests(), 3)
	require.GreaterOrEqual(t, time.Since(paused), retryAfter-time.Second, "issued before the CA's Retry-After")
}

// A refusal no retry can fix (here rejectedIdentifier, and Let's Encrypt's pause of an
// account and name, whose unpause link goes to the operator's log, not to the tenant's
// ssl_error) marks the domain failed at once, with the CA's problem in ssl_error, after
// one order instead of ten; `certworker retry` brings it back once the cause is fixed.
func TestE2E_APermanentRefusalFailsAtOnceUntilRetried(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		answer  func(name string) pebbletest.Answer
		errorRe string
	}{
		{"rejectedIdentifier", pebbletest.RejectedIdentifier, `rejectedIdentifier`},
		{"paused account and name", pebbletest.Paused, `paused issuance .* the link in certworker's log \(unpause_url\)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, pebbletest.Options{})
			front := pebbletest.NewFront(t, w.ca)
			cfg := w.acmeConfig()
			cfg.DirectoryURL = front.DirectoryURL
			name := randomName("refused")
			front.Add(pebbletest.Rule{Step: pebbletest.StepNewOrder, Names: []string{name}, Times: 1, Answer: tc.answer(name)})
			w.startWorker(t, "w", cfg, worker.Config{Concurrency: 1, PollInterval: 30 * time.Second})
			id := w.addDomains(t, name)[0]
			waitFor(t, 20*time.Second, "the domain to fail", func() bool { return w.domain(t, id).Status == "failed" })
			d := w.domain(t, id)
			require.Equal(t, 1, d.Attempts, "one order, not ten")
			require.Regexp(t, tc.errorRe, *d.Error)
			require.NotContains(t, *d.Error, pebbletest.UnpauseLinkPrefix)
			require.Equal(t, 1, front.Answered()[pebbletest.StepNewOrder])

			require.NoError(t, queue.New(w.pool, issuing.DefaultConfig()).Retry(w.ctx, name))
			waitFor(t, 20*time.Second, "the retried domain to be issued", func() bool { return w.domain(t, id).Status == "active" })
		})
	}
}

// A certificate the CA means to revoke: its renewal window moves earlier, and the
// worker, which asks again for the window of every stored certificate at the CA's
// Retry-After, renews it now instead of at the renewal time drawn at issuance, naming
// the certificate it replaces.
func TestE2E_ARenewalWindowMovedEarlierRenewsNow(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	qcfg := issuing.DefaultConfig()
	qcfg.RetryBase = time.Second
	in := w.startWorker(t, "w", w.acmeConfig(), worker.Config{Queue: qcfg, Concurrency: 1, PollInterval: time.Second})
	name := randomName("revoked")
	id := w.addDomains(t, name)[0]
	waitFor(t, 30*time.Second, "the first certificate", func() bool { return w.domain(t, id).Status == "active" })
	var serial string
	var renewAt time.Time
	require.NoError(t, w.pool.QueryRow(w.ctx, `SELECT serial, renew_at FROM proxy_certificates WHERE domain = $1`, name).Scan(&serial, &renewAt))
	require.Greater(t, time.Until(renewAt), 24*time.Hour, "a 90-day certificate renews in weeks")
	n, ok := new(big.Int).SetString(serial, 16)
	require.True(t, ok)
	now := time.Now()
	require.NoError(t, w.ca.SetRenewalWindow(n, now.Add(-2*time.Minute), now.Add(-time.Minute)))
	// The CA's Retry-After is hours; the time to ask again is brought forward.
	_, err := w.pool.Exec(w.ctx, `UPDATE proxy_certificates SET ari_next_at = now() WHERE domain = $1`, name)
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the renewal", func() bool { return len(ordersFor(w.ca, name)) == 2 })
	waitFor(t, 30*time.Second, "the new certificate", func() bool {
		var s string
		require.NoError(t, w.pool.QueryRow(w.ctx, `SELECT serial FROM proxy_certificates WHERE domain = $1`, name).Scan(&s))
		return s != serial
	})
	require.NotEmpty(t, ordersFor(w.ca, name)[1].Replaces, "the renewal must name the certificate it replaces")
	require.Equal(t, 1, in.Logs.FilterMessage("the CA moved the certificate's renewal window earlier; renewing sooner").Len())
}

// The ledger keeps the fleet inside the CA's limits without asking the CA: two
// instances, a ledger limit of 2 certificates per registered domain, 5 names under one
// registered domain and 3 under others. Exactly 2 orders reach the CA for the first,
// 1 for each of the others; the 3 that wait are not charged, and `status` says why.
func TestE2E_TheLedgerKeepsTwoInstancesInsideALimit(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	limits := issuing.Limits{CertsPerRegisteredDomain: issuing.Limit{Count: 2, Window: time.Hour}}
	wcfg := worker.Config{Concurrency: 4, PollInterval: 30 * time.Second, Limits: limits}
	w.startWorker(t, "a", w.acmeConfig(), wcfg)
	w.startWorker(t, "b", w.acmeConfig(), wcfg)
	rd := "shop-" + randomHex() + ".example"
	var under []string
	for i := range 5 {
		under = append(under, fmt.Sprintf("n%d.%s", i, rd))
	}
	others := []string{randomName("other"), randomName("other"), randomName("other")}
	ids := w.addDomains(t, append(append([]string{}, under...), others...)...)
	waitFor(t, 30*time.Second, "5 certificates", func() bool { return w.statuses(t)["active"] == 5 })
	time.Sleep(2 * time.Second) // long enough for a wrong third order under the limit to show

	var reached int
	for _, n := range under {
		reached += len(ordersFor(w.ca, n))
	}
	require.Equal(t, 2, reached, "orders that reached the CA for names under %s", rd)
	for _, n := range others {
		require.Len(t, ordersFor(w.ca, n), 1, "%s", n)
	}
	q := queue.New(w.pool, issuing.DefaultConfig())
	waiting := 0
	for i, n := range under {
		d := w.domain(t, ids[i])
		if d.Status == "active" {
			continue
		}
		waiting++
		require.Equal(t, "pending", d.Status, "%s", n)
		require.Zero(t, d.Attempts, "%s was charged for the ledger", n)
		s, err := q.State(w.ctx, n)
		require.NoError(t, err)
		require.NotNil(t, s.PauseReason, "%s: status does not say why it waits", n)
		require.Contains(t, *s.PauseReason, "--limit-certs-per-registered-domain")
		require.Contains(t, *s.PauseReason, rd)
	}
	require.Equal(t, 3, waiting)
}
