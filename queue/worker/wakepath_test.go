package worker_test

import (
	"context"
	"errors"
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

// A pass woken by a notification claims from the rows in line as they stand, without
// bringing held rows back first (the row it was woken for is in line already). A row
// held out of line for its backoff still comes back when the backoff ends while
// notifications keep waking the worker faster than its timer's retry (every 2 ms,
// each pass resetting the timer): the pass after one that found something due it did
// not claim brings held rows back first. Guards against a retry held off for as long
// as the wake-ups go on.
func TestWorker_AHeldRowComesBackWhileNotificationsKeepComing(t *testing.T) {
	t.Parallel()
	d := newBenchDB(t)
	ids := d.insertDomains(t, 1, "verified")
	fake := fakeissuer.New(16)
	fake.Set(func(f *fakeissuer.Issuer) {
		f.Fail = func(_ string, n int) error {
			if n == 1 {
				return errors.New("the CA said no, this once")
			}
			return nil
		}
	})
	// The notifications start before the worker, so they keep coming through the
	// whole backoff. (Started once the test saw the row held, they could miss it on a
	// busy machine: the backoff is 300 ms, and the retry had already succeeded.)
	ctx, stop := context.WithCancel(d.ctx)
	defer stop()
	streamDone := make(chan int, 1)
	go func() {
		sent := 0
		defer func() { streamDone <- sent }()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for end := time.Now().Add(time.Minute); time.Now().Before(end); {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if _, err := d.pool.Exec(ctx, `SELECT pg_notify('certworker_wake', '')`); err != nil {
				return
			}
			sent++
		}
	}()
	in := workertest.Start(t, d.dsn, "held", worker.Config{Issuer: fake, Concurrency: 4, PollInterval: time.Hour,
		Queue: issuing.Config{RetryBase: 300 * time.Millisecond, RetryMax: 300 * time.Millisecond, MaxAttempts: 5}})
	workertest.Eventually(t, 2*time.Minute, "the held row claimed again", func() bool {
		return fake.Count("bench1.example") == 2
	})
	select {
	case <-streamDone:
		t.Fatal("the held row came back only once the notifications stopped")
	default:
	}
	stop()
	t.Logf("notifications sent before the retry: %d", <-streamDone)
	// The first order failed and held the row out of line for its backoff.
	failed := in.Logs.FilterMessage("issuance failed, will retry").All()
	require.Len(t, failed, 1)
	require.Equal(t, int64(1), failed[0].ContextMap()["attempt"])
	var held *string
	require.NoError(t, d.pool.QueryRow(d.ctx, `SELECT ssl_held FROM proxy_domains WHERE id = $1`, ids[0]).Scan(&held))
	require.Nil(t, held, "the row is still held out of line")
	workertest.Eventually(t, 30*time.Second, "the row active", func() bool { return d.countActive(t) == 1 })
}

// A connection the warm-up could not open, once the server has given one, is tried
// again within the warm-up's bound: here the pool's second connect fails, as one
// past its timeout on a busy server does, and Start still returns with every
// connection the worker may use at once open. The warm-up stopped at the first
// failure.
func TestStart_TheWarmUpTriesAgainAConnectionThatFailed(t *testing.T) {
	t.Parallel()
	d := newBenchDB(t)
	cfg := worker.Config{Issuer: fakeissuer.New(64), Concurrency: 4, PollInterval: time.Hour}
	var connects, refused atomic.Int32
	pool := d.poolConnectingThrough(t, cfg, func(context.Context, *pgx.ConnConfig) error {
		if connects.Add(1) == 2 {
			refused.Add(1)
			return errors.New("the second connect fails")
		}
		return nil
	})
	cfg.Pool = pool
	in := workertest.Start(t, d.dsn, "warm", cfg)
	require.EqualValues(t, 1, refused.Load(), "the second connect did not fail")
	require.EqualValues(t, min(pool.Config().MaxConns, int32(cfg.Concurrency+4)), pool.Stat().TotalConns(),
		"connections open when Start returned")
	require.Zero(t, in.Logs.FilterMessage("pool warm-up incomplete; the other connections are opened and warmed on first use").Len())
}

// The warm-up opens the pool's connections at once, not one after another: on a
// busy server, where warming one took 7.5 s, four in a row outlasted the warm-up's
// bound (a quarter of the lease) and Start returned with two. Here each connect waits
// until every connection the worker may use at once is being opened; one at a time,
// the first would wait alone and the barrier never fill.
func TestStart_TheWarmUpOpensTheConnectionsAtOnce(t *testing.T) {
	t.Parallel()
	d := newBenchDB(t)
	cfg := worker.Config{Issuer: fakeissuer.New(64), Concurrency: 4, PollInterval: time.Hour}
	var want int32 // set before the pool's first connect
	var arrived atomic.Int32
	all := make(chan struct{})
	pool := d.poolConnectingThrough(t, cfg, func(ctx context.Context, _ *pgx.ConnConfig) error {
		switch n := arrived.Add(1); {
		case n == want:
			close(all)
		case n > want:
			return nil
		}
		select {
		case <-all:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Second):
			return errors.New("the other connects did not start within 20 s")
		}
	})
	want = min(pool.Config().MaxConns, int32(cfg.Concurrency+4))
	cfg.Pool = pool
	in := workertest.Start(t, d.dsn, "warm", cfg)
	select {
	case <-all:
	default:
		t.Fatalf("only %d of %d connects were under way at once", arrived.Load(), want)
	}
	require.EqualValues(t, want, pool.Stat().TotalConns(), "connections open when Start returned")
	require.Zero(t, in.Logs.FilterMessage("pool warm-up incomplete; the other connections are opened and warmed on first use").Len())
}

// When Start returns, the worker's pool holds all its connections, each with the
// claim prepared and planned by the warm-up (queue.Queue.WarmUp), so the first
// tenants' verifies are not claimed on sessions that plan the claim cold
// (docs/internals.md, The wake path and held rows). The claims the worker ran on them were
// run on the plan the warm-up settled on: no connection planned the claim more than
// the warm-up's five times. Without the warm-up, a connection that has not claimed
// yet has no claim statement, and one that has planned it at each of its first five
// claims.
func TestStart_ThePoolsConnectionsAreWarmedUpForTheClaim(t *testing.T) {
	t.Parallel()
	d := newBenchDB(t)
	ids := d.insertDomains(t, 1000, "pending")[:20]
	cfg := worker.Config{Issuer: fakeissuer.New(64), Concurrency: 4, PollInterval: time.Hour}
	// The pool `certworker run` makes, warm-up included (a test's Start leaves it out).
	pool, err := queue.NewPoolWith(d.ctx, d.dsn, workertest.Session(cfg))
	require.NoError(t, err)
	cfg.Pool = pool
	in := workertest.Start(t, d.dsn, "warm", cfg)
	require.Equal(t, in.Pool.Config().MaxConns, in.Pool.Stat().TotalConns(), "connections open when Start returned")

	d.verifyOneByOne(t, ids, time.Now(), 5*time.Millisecond)
	d.waitActive(t, len(ids), time.Minute, 20*time.Millisecond)
	require.NoError(t, in.Stop(t, time.Minute))
	// A connection can still be on its way back to the pool, or being replaced (and
	// warmed) after one the stop ended was destroyed: read them once all are idle.
	workertest.Eventually(t, 10*time.Second, "every connection of the pool idle", func() bool {
		s := in.Pool.Stat()
		return s.IdleConns() == s.TotalConns()
	})

	conns := in.Pool.AcquireAllIdle(d.ctx)
	type claimPlans struct{ n, custom, generic int64 }
	var seen []claimPlans
	for _, c := range conns {
		var p claimPlans
		err := c.QueryRow(d.ctx, `SELECT count(*), COALESCE(sum(custom_plans), 0), COALESCE(sum(generic_plans), 0)
FROM pg_prepared_statements WHERE statement LIKE '%WITH head AS MATERIALIZED%' AND statement NOT LIKE '%pg_prepared_statements%'`).Scan(&p.n, &p.custom, &p.generic)
		c.Release() // before any assertion: the pool's Close waits for it
		require.NoError(t, err)
		seen = append(seen, p)
	}
	require.Len(t, seen, int(in.Pool.Stat().TotalConns()), "idle connections after the worker stopped")
	generic := int64(0)
	for _, p := range seen {
		require.Equal(t, int64(1), p.n, "claim statements prepared on a connection of the pool")
		require.Equal(t, int64(5), p.custom, "custom plans of the claim on a connection of the pool (the warm-up's)")
		generic += p.generic
	}
	// One generic plan per connection was built by its warm-up; the passes that claimed
	// the 20 domains (some woken by several verifies at once) ran on them.
	require.Greater(t, generic, int64(len(conns)), "claims run on the warm-up's generic plans")
}

// poolConnectingThrough is the pool a worker with cfg gets, with before as its
// BeforeConnect: a test's hand on each connect the pool makes.
func (d *benchDB) poolConnectingThrough(t *testing.T, cfg worker.Config, before func(context.Context, *pgx.ConnConfig) error) *pgxpool.Pool {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(d.dsn)
	require.NoError(t, err)
	queue.ConfigureSession(pcfg, workertest.TestSession(cfg))
	pcfg.BeforeConnect = before
	pool, err := pgxpool.NewWithConfig(d.ctx, pcfg)
	require.NoError(t, err)
	return pool
}
