package worker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// claimMarker is a piece of the claim statement's text, to aim faults at it.
const claimMarker = "ssl_claim_prev_attempt_at = d.ssl_last_attempt_at"

// passStatements are pieces of the text of every statement a pass or the maintenance
// runs (the claim, the next due time, reclaiming, renewals), and of none that renews a
// lease or records a result.
var passStatements = []string{
	claimMarker,
	"per_count",                       // NextDue
	"min(ssl_renew_by)",               // NextMaintenance
	"COALESCE(ssl_lease_expires_at",   // ReclaimAbandoned
	"ssl_attempts = 0, updated_at",    // MarkRenewals
	"renew_at IS NULL AND auto_renew", // filling in renewal times
	"SET ssl_queue_tier = 1",          // PromoteUrgentRenewals
	"NOT (ssl_claim_token = ANY",      // ReleaseUntracked
}

// A claim whose statement committed is never dropped. The answer of the claim
// statement is lost after it committed (a connection that drops, a timeout that fires
// then): the rows are 'provisioning' under this instance's name, and the instance
// does not know their tokens. They are handed back, uncharged, and claimed again at
// once, rather than wait for their lease and be charged by the reclaim.
func TestWorker_AClaimWhoseAnswerWasLostIsHandedBackUncharged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	db := &faultDB{Pool: b.pool}
	db.loseNext(claimMarker, 1)
	id, name := b.domain(t, b.tenant(t))
	in := b.start(t, "w", worker.Config{DB: db, Issuer: fake, Concurrency: 1, PollInterval: time.Hour})
	b.waitStatus(t, id, "active", 10*time.Second) // the lease is 60 s: only a hand-back explains this
	require.Equal(t, 1, fake.Count(name), "ordered twice")
	require.Equal(t, 0, b.row(t, id).Attempts)
	require.Equal(t, 1.0, in.Metric(t, "certworker_issuance_total", "released_untracked"))
	require.Equal(t, 1, in.Logs.FilterMessage("claim handed back: its statement committed but its answer was lost; not charged").Len())
}

// SIGTERM while a claim's answer is lost: the shutdown hands back what the instance
// holds under its name, so nothing is left in 'provisioning'.
func TestWorker_StopHandsBackAClaimWhoseAnswerWasLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	db := &faultDB{Pool: b.pool}
	tn := b.tenant(t)
	in := b.start(t, "w", worker.Config{DB: db, Issuer: fake, Concurrency: 1, PollInterval: time.Hour})
	in.WaitForLog(t, "pass finished", 1, 10*time.Second)
	db.loseNext(claimMarker, 1000) // every claim from now on
	id, _ := b.domain(t, tn)
	workertest.Eventually(t, 10*time.Second, "the claim", func() bool { return b.status(t, id) == "provisioning" })
	require.NoError(t, in.Stop(t, 20*time.Second))
	r := b.row(t, id)
	require.Equal(t, "pending", r.Status)
	require.Zero(t, r.Attempts)
	require.Nil(t, r.Token)
	require.Zero(t, fake.Count(id))
}

// Leases are renewed on a timer of their own. Here every statement of a pass and of
// the maintenance hangs until its deadline (a database answering the heartbeat but not
// them); an order of 6 s on a 3 s lease keeps its claim, and a second instance, up
// long enough to reclaim, does not take it: the domain is ordered once.
func TestWorker_LeasesAreRenewedWhilePassesHang(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	fake.Delay = 6 * time.Second
	qcfg := issuing.Config{Lease: 3 * time.Second}
	db := &faultDB{Pool: b.workerPool(t, qcfg.Lease)}
	slow := b.start(t, "slow", worker.Config{DB: db, Issuer: fake, Queue: qcfg, Concurrency: 2, PollInterval: 200 * time.Millisecond})
	id, name := b.domain(t, b.tenant(t))
	fake.Next(t, 10*time.Second)
	db.hangOn(passStatements...)
	b.start(t, "other", worker.Config{Issuer: fake, Queue: qcfg, Concurrency: 2, PollInterval: 200 * time.Millisecond})
	b.waitStatus(t, id, "active", 20*time.Second)
	require.Equal(t, 1, fake.Count(name), "the domain was ordered twice")
	require.Zero(t, slow.Metric(t, "certworker_issuance_total", "lost"))
}

// Fencing: an order stops as soon as a heartbeat finds its claim taken, and writes
// nothing. The claim is taken here as an instance that reclaimed and claimed the row
// would take it, and kept as that instance would keep it: a lease of the same length,
// renewed while the test runs. (A lease of an hour, longer than any instance's, is
// one the reclaim does not trust: it put the row back, and the worker claimed it
// again, in a run beside a CPU hog.)
func TestWorker_AnOrderStopsWhenItsClaimIsTaken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	fake.Delay = time.Hour
	qcfg := issuing.Config{Lease: 3 * time.Second}
	in := b.start(t, "w", worker.Config{Issuer: fake, Queue: qcfg, Concurrency: 1, PollInterval: time.Hour})
	id, name := b.domain(t, b.tenant(t))
	fake.Next(t, 10*time.Second)
	var thief string
	const takeSQL = `
UPDATE proxy_domains SET ssl_claim_token = COALESCE($2::uuid, gen_random_uuid()), ssl_claimed_by = 'thief',
    ssl_lease_expires_at = now() + make_interval(secs => $3)
WHERE id = $1 AND ($2::uuid IS NULL OR ssl_claim_token = $2::uuid) RETURNING ssl_claim_token::text`
	require.NoError(t, b.pool.QueryRow(b.ctx, takeSQL, id, nil, qcfg.Lease.Seconds()).Scan(&thief))
	hctx, stopHeartbeat := context.WithCancel(b.ctx)
	heartbeat := make(chan error, 1)
	go func() {
		for {
			select {
			case <-hctx.Done():
				heartbeat <- nil
				return
			case <-time.After(qcfg.Lease / 3):
			}
			var token string
			if err := b.pool.QueryRow(hctx, takeSQL, id, thief, qcfg.Lease.Seconds()).Scan(&token); err != nil && hctx.Err() == nil {
				heartbeat <- fmt.Errorf("the thief's heartbeat: %w", err)
				return
			}
		}
	}()
	t.Cleanup(stopHeartbeat)
	workertest.Eventually(t, 3*time.Second, "the order to be cancelled (a heartbeat is every second)", func() bool {
		return fake.Cancelled(name) == 1
	})
	in.WaitForLog(t, "order abandoned: the claim was lost to another instance", 1, 5*time.Second)
	stopHeartbeat()
	require.NoError(t, <-heartbeat)
	r := b.row(t, id)
	require.Equal(t, "provisioning", r.Status, "the instance that lost the claim wrote the row")
	require.Equal(t, thief, *r.Token)
	require.Zero(t, r.Attempts)
	in.WaitForMetric(t, 1, 10*time.Second, "certworker_issuance_total", "lost")
}

// An order has a deadline: one that runs past --order-timeout is cancelled and
// charged, with ssl_error saying it timed out. Not a CA outage: nothing is paused.
// Without it a hung order held its slot, and renewed its lease, for ever.
func TestWorker_AnOrderPastItsDeadlineIsCancelledAndCharged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	fake.Delay = time.Hour
	in := b.start(t, "w", worker.Config{Issuer: fake, Concurrency: 1, PollInterval: time.Hour, OrderTimeout: time.Second})
	id, name := b.domain(t, b.tenant(t))
	fake.Next(t, 10*time.Second)
	workertest.Eventually(t, 10*time.Second, "the failure to be recorded", func() bool { return b.row(t, id).Attempts == 1 })
	r := b.row(t, id)
	require.Equal(t, "pending", r.Status)
	require.Regexp(t, `^order timed out after 1s`, *r.Error)
	require.Equal(t, 1, fake.Cancelled(name))
	in.WaitForMetric(t, 1, 10*time.Second, "certworker_issuance_total", "timeout")
	var pauses int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM certworker_pauses`).Scan(&pauses))
	require.Zero(t, pauses, "a slow order paused the CA")
}

// A result is stored only while the domain is still an ACME domain: a tenant who
// switches to manual and uploads a certificate mid-order keeps the upload, and the
// worker lets go of the row.
func TestWorker_AResultIsDroppedWhenTheDomainIsNoLongerACME(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	fake.Delay = time.Second
	in := b.start(t, "w", worker.Config{Issuer: fake, Concurrency: 1, PollInterval: time.Hour})
	id, name := b.domain(t, b.tenant(t))
	fake.Next(t, 10*time.Second)
	_, err := b.pool.Exec(context.Background(), `UPDATE proxy_domains SET ssl_provider = 'manual' WHERE id = $1`, id)
	require.NoError(t, err)
	_, err = b.pool.Exec(context.Background(), `
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at) VALUES ($1, 'uploaded', 'uploaded key', now() + interval '30 days')`, name)
	require.NoError(t, err)
	in.WaitForLog(t, "result dropped: the domain's provider is no longer acme", 1, 10*time.Second)
	var pem string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT certificate_pem FROM proxy_certificates WHERE domain = $1`, name).Scan(&pem))
	require.Equal(t, "uploaded", pem, "the tenant's upload was overwritten")
	r := b.row(t, id)
	require.Nil(t, r.Token, "the worker kept its claim on a manual domain")
	in.WaitForMetric(t, 1, 10*time.Second, "certworker_issuance_total", "not_acme")
}

// Start's statements are not bounded by the lease: nothing is leased yet. Here the
// first, the read of the wake mode, answers 1.5 s late under a 3 s lease (whose
// statements are cut off after 750 ms), as a server just started or a busy host
// answers: the worker starts, and issues. Two tests failed beside a CPU hog with
// "start: wake mode notify: read wake mode: context deadline exceeded".
func TestStart_ASlowFirstStatementDoesNotFailItUnderAShortLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	db := &faultDB{Pool: b.workerPool(t, 3*time.Second)}
	db.slowNext("SELECT wake FROM certworker_settings", 1500*time.Millisecond)
	in := b.start(t, "w", worker.Config{DB: db, Issuer: fake, Queue: issuing.Config{Lease: 3 * time.Second},
		Concurrency: 1, PollInterval: time.Hour})
	require.Equal(t, 1, in.Logs.FilterMessage("worker started").Len())
	id, name := b.domain(t, b.tenant(t))
	b.waitStatus(t, id, "active", 10*time.Second)
	require.Equal(t, 1, fake.Count(name))
}

// Steps that run out of time on a slow server keep the worker's sessions: the server
// ends each statement at its statement_timeout (57014) within the step's grace, and
// the pool never replaces a session. Here every claim and maintenance statement waits
// for a lock held by another transaction for longer than several steps (a quarter of
// a 4 s lease; the lock_timeout is 2 s). A step whose time ran out before it sent
// its statement (the pass's earlier statement took it all) cuts nothing. Guards against the worker's statements being
// cut at the step's deadline, which closed their connections: on a busy server the
// next step then waited for a new session and ran cold, and ran out again (a worker
// with a 3 s lease saw every step fail for 15 s, and its order lost to another).
func TestWorker_StepsThatRunOutKeepTheirSessions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	in := b.start(t, "w", worker.Config{Issuer: fake, Queue: issuing.Config{Lease: 4 * time.Second},
		Concurrency: 1, PollInterval: 200 * time.Millisecond})
	waitLogs(t, in, "pass finished", 1, 10*time.Second)

	hold, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(b.ctx) }()
	_, err = hold.Exec(b.ctx, `LOCK TABLE certworker_pauses IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	before := in.Logs.FilterMessage("database step failed; will try again").Len()
	waitLogs(t, in, "database step failed; will try again", before+4, 20*time.Second)
	require.NoError(t, hold.Rollback(b.ctx))

	id, name := b.domain(t, b.tenant(t))
	b.waitStatus(t, id, "active", 10*time.Second)
	require.Equal(t, 1, fake.Count(name))

	failed := in.Logs.FilterMessage("database step failed; will try again").All()[before:]
	ended := 0
	for _, e := range failed {
		msg := fmt.Sprint(e.ContextMap()["error"])
		if strings.Contains(msg, "context already done") {
			continue
		}
		require.Contains(t, msg, "SQLSTATE 57014", "step %v ended by the client, not the server", e.ContextMap()["step"])
		ended++
	}
	require.GreaterOrEqual(t, ended, 2, "steps the server ended: %v", failed)
	st := in.Pool.Stat()
	require.LessOrEqual(t, st.NewConnsCount(), int64(st.MaxConns()),
		"%d sessions opened for a pool of %d: steps that ran out closed theirs", st.NewConnsCount(), st.MaxConns())
}

// waitLogs waits until in has logged msg at least n times.
func waitLogs(t *testing.T, in *workertest.Instance, msg string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for in.Logs.FilterMessage(msg).Len() < n {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %d lines %q; have %d", timeout, n, msg, in.Logs.FilterMessage(msg).Len())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
