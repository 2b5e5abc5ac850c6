package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-acme/lego/v4/certificate"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// renewalLifetime is the short profile's validity in the renewal test: long enough
// that an order (a tenth of a second against Pebble once the name's authorization is
// valid, a second or two on a loaded machine) is a small part of it, short enough
// that 2.3 lifetimes take about a minute.
const renewalLifetime = 30 * time.Second

// renewalRun is how long the renewal test lets the worker alone: 2.3 lifetimes, so
// every domain must renew at least twice whatever its renewal times.
const renewalRun = renewalLifetime * 23 / 10

// renewalPollInterval is the worker's safety-net pass in the renewal test. A
// maintenance run aimed at the poll (or at half the duty's lease, as long) is due 30 s
// after the read that set it, far past any renewal time it could be taken for, so
// the run that marked a renewal shows whether the certificate's renewal time reached
// the worker's timer (markedBy).
const renewalPollInterval = 30 * time.Second

// serverClockStep is the resolution of PostgreSQL's clock and timestamps. The delay
// the database computes until a renewal time (renew_at - clock_timestamp()) reads a
// clock truncated to it, so it may exceed the true delay by up to one step.
const serverClockStep = time.Microsecond

// renewalExpiryMargin: a renewal time chosen closer than this to the certificate's
// expiry cannot be held to "stored before not_after", because the order itself
// takes time (about a second when its challenge is validated: the answers carry
// Retry-After: 1), more under -race on a busy machine. acme picks a uniformly random
// point of the CA's ARI window cut at not_after (acme.renewAtFromWindow), and
// Pebble's window for a short certificate is its whole validity, so about one
// renewal in six of this test lands there. Those are logged, not failed: the worker
// claimed them on time (checked), and the margin is acme's to keep, not the
// worker's.
const renewalExpiryMargin = 5 * time.Second

// Three short-lived certificates, left alone for 2.3 lifetimes, are each renewed on
// time, once per renewal time, by the worker's timer. Guards against, in turn:
//   - a renewal loop (a certificate renewed again before its new renewal time, the
//     reference's "30 days before expiry" applied to a 30-second certificate): the
//     CA would see more orders than certificates stored;
//   - a renewal missed or left to the 30-second poll (the renewal time of a
//     certificate just stored never reaching the worker's timer): the maintenance
//     run that marked it was not aimed at its renewal time (markedBy), or a run
//     after the certificate was stored aimed past it (readWhileStored);
//   - renewals ordered as new certificates (no RFC 9773 "replaces"), or without the
//     configured profile;
//   - the proxy finding a domain without a certificate, with an expired one, or
//     failed, at any moment of a renewal: the certificate is replaced in the
//     transaction that stores the new one.
//
// Pebble offers ARI, and its window for a certificate this short is its whole
// validity (core.RenewalInfoSimple: the ideal time ± 24 h, clipped to
// [NotBefore, NotAfter]), so each renewal time is a random point of the lifetime, not
// two thirds of it. "Ordered exactly 1 + floor(elapsed / interval) times" is checked
// in the form that holds for random intervals: one order per certificate stored, and
// one certificate per renewal time that fell due before the end of the run.
func TestE2E_ShortLivedCertificatesAreRenewedOncePerLifetime(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{ShortLifetime: renewalLifetime})
	acfg := w.acmeConfig()
	acfg.Profile = pebbletest.ShortProfile
	// The claim applies the backoff to a renewal too: a domain is claimable
	// base * 2^0 after its previous claim (docs/internals.md, "Claim"), and a renewal marks it
	// pending with 0 attempts. With the default base of a minute, every renewal time
	// that Pebble's window puts less than a minute after the previous order would
	// wait for that minute; a second leaves the renewal time in charge.
	qcfg := issuing.DefaultConfig()
	qcfg.RetryBase = time.Second
	in := w.startWorker(t, "renewer", acfg, worker.Config{Queue: qcfg, Concurrency: 4, PollInterval: renewalPollInterval})

	names := []string{randomName("renew-a"), randomName("renew-b"), randomName("renew-c")}
	s := startSampler(w, 200*time.Millisecond)
	defer s.stop()
	ids := w.addDomains(t, names...)
	waitFor(t, time.Minute, "the three first certificates", func() bool { return w.statuses(t)["active"] == len(ids) })

	runStart := time.Now()
	select {
	case <-time.After(renewalRun):
	case err := <-s.failed:
		t.Fatalf("sampling proxy_certificates: %v", err)
	}
	stopAt := time.Now()
	// SIGTERM: an order in flight finishes inside the grace, so that every order the
	// CA accepted has its certificate stored when the histories are read.
	require.NoError(t, in.Stop(t, time.Minute))
	hist := s.stop()
	t.Logf("ran %s (%.2f lifetimes of %s) after the first certificates; %d samples",
		stopAt.Sub(runStart).Round(time.Second), stopAt.Sub(runStart).Seconds()/renewalLifetime.Seconds(),
		renewalLifetime, s.samples)

	runs := maintenanceRuns(in)
	issued := issuedAt(in)
	for _, name := range names {
		h := hist[name]
		require.NotNil(t, h, "%s was never sampled", name)
		require.Empty(t, h.violations, "%s: what the proxy saw during renewals", name)
		certs := h.certs
		orders := ordersFor(w.ca, name)
		require.Len(t, orders, len(certs),
			"%s: the CA accepted %d orders and %d certificates were stored: an order that stores nothing is a renewal loop or a lost order",
			name, len(orders), len(certs))
		require.Len(t, h.claims, len(certs), "%s: claims %v for %d certificates: an attempt that stored nothing", name, h.claims, len(certs))
		require.GreaterOrEqual(t, len(certs), 1+int(renewalRun/renewalLifetime),
			"%s: fewer certificates than lifetimes elapsed: a renewal was missed", name)

		for i, o := range orders {
			require.Equal(t, pebbletest.ShortProfile, o.Profile, "%s: order %d without the configured profile", name, i)
			if i == 0 {
				require.Empty(t, o.Replaces, "%s: the first order replaces nothing", name)
				continue
			}
			leaf, err := issuing.LeafFromPEM(certs[i-1].pem)
			require.NoError(t, err)
			want, err := certificate.MakeARICertID(leaf)
			require.NoError(t, err)
			require.Equal(t, want, o.Replaces, "%s: renewal %d must name the certificate it replaces", name, i)
		}

		reads := 0
		for i, c := range certs {
			at, ok := issued[c.serial]
			require.True(t, ok, "%s: certificate %s stored without its \"certificate issued\" line", name, c.serial)
			for _, r := range readWhileStored(runs, at, c.renewAt) {
				reads++
				require.False(t, r.due.After(r.latestDue(c.renewAt)),
					"%s: certificate %d (stored, logged at %s) is due at %s, and the run after a read at %s, while it was stored and not yet due, aimed past it at %s (%s): its renewal time did not reach the timer",
					name, i, fmtTime(at), fmtTime(c.renewAt), fmtTime(r.readAt), fmtTime(r.due), r.why)
			}
		}

		for i := 1; i < len(certs); i++ {
			prev, cur := certs[i-1], certs[i]
			claim := h.claims[i]
			lateness := claim.Sub(prev.renewAt)
			t.Logf("%s renewal %d: renew_at at %4.1f%% of the lifetime, claimed %6.3fs after it, stored %5.1fs before not_after (order took %.2fs)",
				name, i, 100*prev.renewAt.Sub(prev.notBefore).Seconds()/prev.notAfter.Sub(prev.notBefore).Seconds(),
				lateness.Seconds(), prev.notAfter.Sub(cur.storedAt).Seconds(), cur.storedAt.Sub(claim).Seconds())
			require.False(t, claim.Before(prev.renewAt),
				"%s: renewal %d claimed at %s, before the renewal time %s", name, i, claim, prev.renewAt)
			r, ok := markedBy(runs, prev.renewAt, h.claims[i-1], claim)
			require.True(t, ok,
				"%s: renewal %d (renewal time %s, claimed at %s): no maintenance run aimed at the renewal time, or sooner, marked it: left to the poll? runs around it:\n%s",
				name, i, fmtTime(prev.renewAt), fmtTime(claim), runsAround(runs, prev.renewAt, claim))
			t.Logf("%s renewal %d: marked by the run aimed at %s (%s; read in %s), which marked %d",
				name, i, fmtTime(r.due), r.why, r.readDone.Sub(r.readAt), r.renewals)
			if prev.notAfter.Sub(prev.renewAt) < renewalExpiryMargin {
				// acme's choice, not the worker's: see renewalExpiryMargin.
				t.Logf("%s renewal %d: renewal time chosen %s before not_after (inside the CA's window); stored at not_after %+.3fs",
					name, i, prev.notAfter.Sub(prev.renewAt).Round(time.Millisecond), cur.storedAt.Sub(prev.notAfter).Seconds())
				continue
			}
			require.True(t, cur.storedAt.Before(prev.notAfter),
				"%s: renewal %d stored at %s, after the certificate it replaces expired (%s)", name, i, cur.storedAt, prev.notAfter)
			_, expired := h.expiredSeen[prev.serial]
			require.False(t, expired, "%s: certificate %s was served after its not_after %s", name, prev.serial, prev.notAfter)
		}
		// The last certificate's renewal, if it fell due, may be cut off by the stop
		// at any point, so only this is exact: the first run of the duty after it
		// was due and stored, if it ended before the stop began (a run the stop cut
		// marks nothing: seen beside a CPU hog, a run 5 ms after the renewal time),
		// marked it (no other statement locks an active row here for markRenewals to
		// skip), and the stop left it marked, not active.
		last := certs[len(certs)-1]
		tail := "no maintenance run started after it was due"
		if r, ok := firstRunFrom(runs, laterOf(last.renewAt, issued[last.serial])); ok && !r.logged.Before(stopAt) {
			tail = fmt.Sprintf("the run that started at %s ended after the stop began", fmtTime(r.started))
		} else if ok {
			require.True(t, r.renewals >= 1 && h.status != "active",
				"%s: the last certificate was due at %s and the run that started at %s marked %d renewals; the domain ended %q",
				name, fmtTime(last.renewAt), fmtTime(r.started), r.renewals, h.status)
			tail = fmt.Sprintf("marked by the run that started at %s, ended %s", fmtTime(r.started), h.status)
		}
		t.Logf("%s: %d certificates; not 'active' in %d of %d samples after the first (pending or provisioning while renewing, certificate in place); %d aims read while a certificate was stored and not yet due, none past it; the last certificate: %s",
			name, len(certs), h.notActive, h.after, reads, tail)
	}
}

// sampler reads what the proxy reads (every domain of the world's tenant, with its
// certificate) at a fixed interval, and keeps each domain's history.
type sampler struct {
	w      *world
	every  time.Duration
	cancel context.CancelFunc
	done   chan struct{}
	failed chan error

	mu      sync.Mutex
	hist    map[string]*history
	samples int
}

type history struct {
	certs []seenCert
	// status is ssl_status at the last sample.
	status string
	// claims are the distinct ssl_last_attempt_at values: one per claim.
	claims []time.Time
	// after counts samples after the first certificate, notActive those of them
	// with ssl_status other than 'active'.
	after, notActive int
	violations       []string
	// expiredSeen is when a certificate was first found stored past its not_after,
	// by serial.
	expiredSeen map[string]time.Time
}

type seenCert struct {
	serial                       string
	pem                          string
	notBefore, notAfter, renewAt time.Time
	// storedAt is proxy_certificates.updated_at: the storing transaction's time.
	storedAt time.Time
}

func startSampler(w *world, every time.Duration) *sampler {
	ctx, cancel := context.WithCancel(w.ctx)
	s := &sampler{w: w, every: every, cancel: cancel, done: make(chan struct{}), failed: make(chan error, 1),
		hist: map[string]*history{}}
	go s.run(ctx)
	return s
}

// stop ends sampling with one last sample, so that a certificate stored since the
// last tick (an order the worker finished while stopping) is in the histories, and
// returns them. Safe to call twice.
func (s *sampler) stop() map[string]*history {
	s.cancel()
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		panic("the certificate sampler did not stop within 30 s")
	}
	if err := s.sample(s.w.ctx); err != nil && s.w.ctx.Err() == nil {
		panic(fmt.Sprintf("the certificate sampler's last sample: %v", err))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hist
}

func (s *sampler) run(ctx context.Context) {
	defer close(s.done)
	tick := time.NewTicker(s.every)
	defer tick.Stop()
	for {
		if err := s.sample(ctx); err != nil && ctx.Err() == nil {
			select {
			case s.failed <- err:
			default:
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (s *sampler) sample(ctx context.Context) error {
	rows, err := s.w.pool.Query(ctx, `
SELECT d.domain, d.ssl_status, d.ssl_error, d.ssl_last_attempt_at,
       c.serial, c.certificate_pem, c.not_before, c.expires_at, c.renew_at, c.updated_at, now()
FROM proxy_domains d LEFT JOIN proxy_certificates c ON c.domain = d.domain
WHERE d.tenant_id = $1`, s.w.tenant)
	if err != nil {
		return err
	}
	defer rows.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples++
	for rows.Next() {
		var (
			domain, status                            string
			sslErr, serial, pemText                   *string
			lastAttempt, notBefore, notAfter, renewAt *time.Time
			storedAt                                  *time.Time
			now                                       time.Time
		)
		if err := rows.Scan(&domain, &status, &sslErr, &lastAttempt, &serial, &pemText, &notBefore, &notAfter,
			&renewAt, &storedAt, &now); err != nil {
			return err
		}
		h := s.hist[domain]
		if h == nil {
			h = &history{expiredSeen: map[string]time.Time{}}
			s.hist[domain] = h
		}
		if lastAttempt != nil && (len(h.claims) == 0 || !h.claims[len(h.claims)-1].Equal(*lastAttempt)) {
			h.claims = append(h.claims, *lastAttempt)
		}
		violate := func(format string, args ...any) {
			if len(h.violations) < 20 {
				h.violations = append(h.violations, now.Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
			}
		}
		if len(h.certs) == 0 && serial == nil {
			continue // not issued yet
		}
		h.status = status
		h.after++
		if status != "active" {
			h.notActive++
		}
		switch {
		case serial == nil:
			violate("ssl_status %s and no certificate stored", status)
			continue
		case status == "failed" || sslErr != nil:
			violate("ssl_status %s, ssl_error %v", status, deref(sslErr))
		case notAfter != nil && now.After(*notAfter):
			// Judged after the run: it depends on the renewal time acme chose.
			if _, ok := h.expiredSeen[*serial]; !ok {
				h.expiredSeen[*serial] = now
			}
		}
		if n := len(h.certs); n == 0 || h.certs[n-1].serial != *serial {
			if notBefore == nil || notAfter == nil || renewAt == nil || storedAt == nil || pemText == nil {
				violate("certificate %s stored without its metadata", *serial)
				continue
			}
			h.certs = append(h.certs, seenCert{serial: *serial, pem: *pemText, notBefore: *notBefore,
				notAfter: *notAfter, renewAt: *renewAt, storedAt: *storedAt})
		}
	}
	return rows.Err()
}

// maintenanceRun is one "maintenance ran" line of the worker: the aim its timer fired
// for (worker.nextMaint: due, without the timer's slack, from a delay the database
// computed between readAt and readDone), when it started and was logged, and the
// renewals it marked.
type maintenanceRun struct {
	due, readAt, readDone, started, logged time.Time
	why                                    string
	duty                                   bool
	renewals                               int64
}

func maintenanceRuns(in *workertest.Instance) []maintenanceRun {
	var runs []maintenanceRun
	for _, e := range in.Logs.FilterMessage("maintenance ran").All() {
		m := e.ContextMap()
		at := func(k string) time.Time { t, _ := m[k].(time.Time); return t.Round(0) }
		why, _ := m["why"].(string)
		duty, _ := m["duty"].(bool)
		renewals, _ := m["renewals"].(int64)
		runs = append(runs, maintenanceRun{due: at("due"), readAt: at("read_at"), readDone: at("read_done"),
			started: at("started"), logged: e.Time.Round(0), why: why, duty: duty, renewals: renewals})
	}
	return runs
}

// issuedAt is when the worker logged each certificate it stored ("certificate
// issued", after the storing transaction committed), by serial.
func issuedAt(in *workertest.Instance) map[string]time.Time {
	at := map[string]time.Time{}
	for _, e := range in.Logs.FilterMessage("certificate issued").All() {
		if serial, ok := e.ContextMap()["serial"].(string); ok {
			at[serial] = e.Time.Round(0)
		}
	}
	return at
}

// latestDue is the latest due an aim read between r.readAt and r.readDone may have
// for a renewal time rt: the server read its clock at some instant of the read, so
// the delay it gave, added to readDone, lands in [rt, max(rt, readAt) + the read's
// duration], whatever the machine's load (worker.nextMaint).
func (r maintenanceRun) latestDue(rt time.Time) time.Time {
	return laterOf(rt, r.readAt).Add(r.readDone.Sub(r.readAt) + serverClockStep)
}

// markedBy finds the maintenance run that marked the renewal due at rt, claimed at
// claim after the previous claim prevClaim: one that marked renewals, was logged at
// or after rt and after prevClaim (its mark came after rt and after the certificate
// was stored, which was after the previous claim), started by the claim (the claim
// follows the mark), and was aimed no later than rt allows (latestDue). A run aimed
// at an earlier renewal time may mark this one too, when both fall due close
// together, and counts. A renewal time that never reached the timer is marked by a run
// aimed at the poll, due 30 s after its read: its due is past latestDue(rt), unless
// rt itself fell within the read's duration of that due.
func markedBy(runs []maintenanceRun, rt, prevClaim, claim time.Time) (maintenanceRun, bool) {
	for _, r := range runs {
		if r.renewals >= 1 && !r.logged.Before(rt) && r.logged.After(prevClaim) &&
			!r.started.Truncate(serverClockStep).After(claim) && !r.due.After(r.latestDue(rt)) {
			return r, true
		}
	}
	return maintenanceRun{}, false
}

// readWhileStored are the runs aimed after a run by a read made after the certificate
// due at rt was stored (its "certificate issued" line, at stored) and before rt.
// Such a read saw the certificate stored, active and not yet due, and the aim after
// a run is the soonest of what it read (queue.NextMaintenance), so its due is at
// latestDue(rt) at the latest. Aims of other kinds are not held to it: a read that
// failed, another holder's lease, and a certificate stored or a renewal window
// recorded for another domain (taken only when sooner than the aim in force, but
// bracketed by their own read).
func readWhileStored(runs []maintenanceRun, stored, rt time.Time) []maintenanceRun {
	var reads []maintenanceRun
	for _, r := range runs {
		if !r.duty || !strings.HasPrefix(r.why, "after a run: ") || r.why == "after a run: unreadable" {
			continue
		}
		if !r.readAt.Before(stored) && r.readAt.Before(rt) {
			reads = append(reads, r)
		}
	}
	return reads
}

// firstRunFrom is the first run of the maintenance duty that started at or after at.
func firstRunFrom(runs []maintenanceRun, at time.Time) (maintenanceRun, bool) {
	for _, r := range runs {
		if r.duty && !r.started.Before(at) {
			return r, true
		}
	}
	return maintenanceRun{}, false
}

// runsAround lists the runs logged from a poll interval before rt to claim, for a
// failure's message.
func runsAround(runs []maintenanceRun, rt, claim time.Time) string {
	var b strings.Builder
	for _, r := range runs {
		if r.logged.Before(rt.Add(-renewalPollInterval)) || r.started.After(claim) {
			continue
		}
		fmt.Fprintf(&b, "  started %s, aimed at %s (%s, read %s..%s), marked %d\n", fmtTime(r.started),
			fmtTime(r.due), r.why, fmtTime(r.readAt), fmtTime(r.readDone), r.renewals)
	}
	return b.String()
}

func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func fmtTime(t time.Time) string { return t.Format("15:04:05.000000") }

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
