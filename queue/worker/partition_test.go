package worker_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// orderStoppedAtDeadline is what the worker logs when an order's lease deadline stops it.
const orderStoppedAtDeadline = "order stopped at its lease deadline: the lease could not be renewed in time; nothing more is sent to the CA, and the claim is handed back uncharged once the database answers"

// An instance cut off from the database alone (its connections reset, new ones
// refused) while an order waits on the CA stops that order by its lease deadline,
// within a lease of the cut: the wait on the CA ends and there is no finalize. Once
// it reaches the database again, and nobody has reclaimed the row, it hands the
// claim back uncharged, and the domain is ordered again and issued.
func TestWorker_AnOrderCutOffFromTheDatabaseStopsAtItsDeadlineAndIsHandedBackUncharged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const lease = 3 * time.Second
	fake := fakeissuer.New(10)
	fake.Delay = time.Hour // the first order waits on the CA until something stops it
	relay, dsn := workertest.Relayed(t, b.dsn)
	in := workertest.Start(t, dsn, "cut-off", worker.Config{Issuer: fake, Queue: issuing.Config{Lease: lease},
		Concurrency: 1, PollInterval: time.Second})
	id, name := b.domain(t, b.tenant(t))
	fake.Next(t, 10*time.Second)
	fake.Set(func(f *fakeissuer.Issuer) { f.Delay = 0 })

	relay.Cut()
	// Its last renewal was sent before the cut, so its deadline is within a lease.
	workertest.Eventually(t, 2*lease, "the order to stop by its deadline", func() bool { return fake.Cancelled(name) == 1 })
	require.Zero(t, fake.Finalized(name), "the cut-off order finalized")
	in.WaitForLog(t, orderStoppedAtDeadline, 1, 5*time.Second)
	require.Equal(t, "provisioning", b.status(t, id), "nothing can be written while cut off")

	relay.Restore()
	b.waitStatus(t, id, "active", 30*time.Second)
	r := b.row(t, id)
	require.Zero(t, r.Attempts, "the hand-back was charged")
	require.Equal(t, 2, fake.Count(name))
	require.Equal(t, 1, fake.Finalized(name))
	// The hand-back's outcome: lease_deadline, or lost when the hand-back committed
	// but its answer did not arrive (a reconnection slower than the step's timeout)
	// and the heartbeat then found the token gone. Either way the row went back
	// uncharged, which Attempts shows.
	workertest.Eventually(t, 10*time.Second, "the hand-back's outcome counted", func() bool {
		return in.Metric(t, "certworker_issuance_total", "lease_deadline")+
			in.Metric(t, "certworker_issuance_total", "lost") >= 1
	})
	require.Equal(t, 1.0, in.Metric(t, "certworker_issuance_total", "lease_deadline")+
		in.Metric(t, "certworker_issuance_total", "lost"))
	require.Zero(t, in.Logs.FilterMessage("domain was left mid-issuance by an instance that stopped; requeued").Len())
}

// The heartbeat has a session of its own, outside the pool: with every connection of
// the instance's pool held by other work for longer than two leases, its lease is
// still renewed, its order runs to the end, and a second instance, up long enough to
// reclaim, does not take the domain.
func TestWorker_LeasesAreRenewedWhileThePoolIsExhausted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const lease = 3 * time.Second
	fake := fakeissuer.New(10)
	fake.Delay = 3 * lease
	cfg := worker.Config{Issuer: fake, Queue: issuing.Config{Lease: lease}, Concurrency: 1, PollInterval: 200 * time.Millisecond}
	busy := b.start(t, "busy", cfg)
	id, name := b.domain(t, b.tenant(t))
	fake.Next(t, 10*time.Second)

	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	var held []*pgxpool.Conn
	for range busy.Pool.Stat().MaxConns() {
		c, err := busy.Pool.Acquire(ctx)
		require.NoError(t, err)
		held = append(held, c)
	}
	release := func() {
		for _, c := range held {
			c.Release()
		}
		held = nil
	}
	defer release()
	b.start(t, "other", cfg)

	workertest.Eventually(t, 2*fake.Delay, "the order to reach its finalize", func() bool { return fake.Finalized(name) == 1 })
	release()
	b.waitStatus(t, id, "active", 20*time.Second)
	require.Equal(t, 1, fake.Count(name), "the domain was ordered twice")
	// The outcome is counted once the order's goroutine has settled the ledger, a
	// moment after the row turned active.
	workertest.Eventually(t, 5*time.Second, "the issuance to be counted", func() bool {
		return busy.Metric(t, "certworker_issuance_total", "issued") == 1
	})
	require.Zero(t, busy.Metric(t, "certworker_lease_renewal_failures_total"))
}

// The heartbeat's session of its own is not warmed up for the wake path
// (queue.ConnectSession): it runs the renewal alone, and its first renewal is due a
// third of a lease after the worker starts. Set up with the pool's warm-up, which a
// busy server can take longer than a lease to finish, it let the lease of an order in
// flight run out: seen under load, where a second instance then took the domain and
// the CA saw it ordered twice. Here every session made after the worker has started
// takes two leases to warm up.
func TestWorker_TheHeartbeatsSessionDoesNotWaitForTheWarmUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const lease = 3 * time.Second
	fake := fakeissuer.New(10)
	fake.Delay = 2 * lease
	cfg := worker.Config{Issuer: fake, Queue: issuing.Config{Lease: lease}, Concurrency: 1, PollInterval: time.Hour}
	var slow atomic.Bool
	session := workertest.TestSession(cfg)
	session.Warm = func(ctx context.Context, _ *pgx.Conn) error {
		if !slow.Load() {
			return nil
		}
		wait := time.NewTimer(2 * lease)
		defer wait.Stop()
		select {
		case <-wait.C:
		case <-ctx.Done():
		}
		return nil
	}
	pool, err := queue.NewPoolWith(b.ctx, b.dsn, session)
	require.NoError(t, err)
	cfg.Pool = pool
	in := b.start(t, "warming", cfg)
	slow.Store(true)

	id, name := b.domain(t, b.tenant(t))
	fake.Next(t, 30*time.Second)
	// Renewals that failed before the order began (on a loaded machine a statement or
	// a connect of the worker's first seconds can outlast its 750 ms step) say nothing
	// of the warm-up: every renewal while the order is in flight must succeed.
	before := in.Metric(t, "certworker_lease_renewal_failures_total")
	b.waitStatus(t, id, "active", 30*time.Second)
	require.Equal(t, 1, fake.Count(name), "the domain was ordered twice")
	require.Zero(t, in.Logs.FilterMessage("lease ran out before it could be renewed; stopping the order and handing the claim back").Len())
	require.Equal(t, before, in.Metric(t, "certworker_lease_renewal_failures_total"), "renewals failed while the order was in flight")
	require.GreaterOrEqual(t, in.Logs.FilterMessage("leases renewed").Len(), 3,
		"the order's lease was renewed fewer than three times in its %s", fake.Delay)
}
