package worker_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/netrelay"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// ledgerLimits turns the ledger on without holding anything back.
var ledgerLimits = issuing.Limits{OrdersPerAccount: issuing.Limit{Count: 1000, Window: time.Hour}}

// The worker's sessions bound their waits: each statement by the worker's step (a
// quarter lease), each lock wait by two seconds, and a transaction whose client went
// quiet by ten seconds, after which the server ends the session. They bounded
// nothing: a worker cut off inside a transaction kept its locks for as long as the
// server kept its connection.
func TestWorker_SessionsBoundTheirWaits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.start(t, "w", worker.Config{Issuer: fakeissuer.New(10), Queue: issuing.Config{Lease: 8 * time.Second}, PollInterval: time.Hour})
	conn, err := in.Pool.Acquire(b.ctx)
	require.NoError(t, err)
	c := conn.Hijack() // its session is ended below; it must not go back to the pool
	defer c.Close(context.Background())
	var statement, lock, idle string
	require.NoError(t, c.QueryRow(b.ctx, `
SELECT current_setting('statement_timeout'), current_setting('lock_timeout'),
       current_setting('idle_in_transaction_session_timeout')`).Scan(&statement, &lock, &idle))
	require.Equal(t, []string{"2s", "2s", "10s"}, []string{statement, lock, idle})

	var pid int
	_, err = c.Exec(b.ctx, `BEGIN`)
	require.NoError(t, err)
	require.NoError(t, c.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	workertest.Eventually(t, 20*time.Second, "the server to end the idle transaction's session", func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n))
		return n == 0
	})
}

// cutAtLedgerLock is an instance's database reached through a relay, which it
// blackholes the moment the instance holds the ledger's lock: the connection stays
// open and passes nothing, as across a partition, and the server keeps the session,
// idle in its transaction, with the lock.
type cutAtLedgerLock struct {
	*pgxpool.Pool
	relay *netrelay.Relay
	once  sync.Once
	cut   chan struct{}
}

func (c *cutAtLedgerLock) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := c.Pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &cutTx{Tx: tx, c: c}, nil
}

type cutTx struct {
	pgx.Tx
	c *cutAtLedgerLock
}

func (t *cutTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	br := t.Tx.SendBatch(ctx, b)
	for _, q := range b.QueuedQueries {
		if strings.Contains(q.SQL, "pg_advisory_xact_lock") {
			return &cutResults{BatchResults: br, c: t.c}
		}
	}
	return br
}

type cutResults struct {
	pgx.BatchResults
	c *cutAtLedgerLock
}

func (r *cutResults) Close() error {
	err := r.BatchResults.Close()
	if err == nil {
		r.c.once.Do(func() {
			r.c.relay.Blackhole()
			close(r.c.cut)
		})
	}
	return err
}

// relayed is dsn with its host and port replaced by a relay to them.
func relayed(t *testing.T, dsn string) (*netrelay.Relay, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	r := netrelay.Start(t, u.Host)
	u.Host = r.Addr()
	return r, u.String()
}

// An instance whose connection stops passing bytes (not closed) while it holds the
// ledger's lock does not stop the fleet: the server ends its transaction once it has
// been idle for the worker session's ten seconds, the other instances' Admits, which
// wait a second at a time and try again, take the lock, and they issue again within
// 30 s. The lock was held for as long as the server kept the cut-off session (hours
// with the default keepalives), and every instance claimed, failed its Admit, and
// claimed again.
func TestWorker_AnInstanceCutOffHoldingTheLedgersLockDoesNotStopTheOthers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(100)
	tn := b.tenant(t)
	relay, viaRelay := relayed(t, b.dsn)
	// A long lease: the cut-off instance's own steps (a quarter of it) outlast the
	// test, so that only the server can end its transaction.
	qcfg := issuing.Config{Lease: 2 * time.Minute}
	pool, err := queue.NewPoolWith(b.ctx, viaRelay, queue.WorkerSession(qcfg.Lease))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	db := &cutAtLedgerLock{Pool: pool, relay: relay, cut: make(chan struct{})}
	b.domain(t, tn)
	workertest.Start(t, viaRelay, "cut", worker.Config{DB: db, Issuer: fake, Queue: qcfg, Limits: ledgerLimits,
		Concurrency: 1, PollInterval: time.Hour})
	t.Cleanup(relay.Restore) // before the instance is stopped (cleanups run last first)
	select {
	case <-db.cut:
	case <-time.After(20 * time.Second):
		t.Fatal("the instance never took the ledger's lock")
	}
	cutAt := time.Now()

	var ids []string
	for range 3 {
		id, _ := b.domain(t, tn)
		ids = append(ids, id)
	}
	b.start(t, "healthy", worker.Config{Issuer: fake, Limits: ledgerLimits, Concurrency: 2, PollInterval: time.Second})
	workertest.Eventually(t, 30*time.Second, "the healthy instance to issue while the other holds the ledger's lock", func() bool {
		for _, id := range ids {
			if b.status(t, id) != "active" {
				return false
			}
		}
		return true
	})
	t.Logf("issued %s after the cut", time.Since(cutAt).Round(time.Second))
}

// A failed Admit ends the fill: the ledger's lock is held elsewhere for longer than
// the step, and the instance, with two slots and four domains due, holds no more than
// two claims at any time, handing them back before it claims again, rather than take
// every due row and hand it back unordered, over and over.
func TestWorker_AFailedAdmitEndsTheFill(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	tn := b.tenant(t)
	var names []string
	for range 4 {
		_, name := b.domain(t, tn)
		names = append(names, name)
	}
	holder, err := pgx.Connect(b.ctx, b.dsn)
	require.NoError(t, err)
	defer holder.Close(context.Background())
	_, err = holder.Exec(b.ctx, `BEGIN`)
	require.NoError(t, err)
	_, err = holder.Exec(b.ctx, `SELECT pg_advisory_xact_lock(hashtext('certworker_ledger'), hashtext($1))`, workertest.Directory)
	require.NoError(t, err)

	// A 4 s lease: each step, an Admit's included, gives up after a second.
	in := b.start(t, "w", worker.Config{Issuer: fake, Queue: issuing.Config{Lease: 4 * time.Second}, Limits: ledgerLimits,
		Concurrency: 2, PollInterval: time.Hour})
	failedAdmits := func() int {
		return in.Logs.FilterMessage("database step failed; will try again").FilterField(zap.String("step", "ask the ledger")).Len()
	}
	most := 0
	deadline := time.Now().Add(30 * time.Second)
	for failedAdmits() < 3 {
		require.True(t, time.Now().Before(deadline), "the instance never asked the ledger three times")
		var held int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM proxy_domains WHERE ssl_status = 'provisioning'`).Scan(&held))
		most = max(most, held)
		time.Sleep(10 * time.Millisecond)
	}
	require.LessOrEqual(t, most, 2, "the instance claimed again after a failed Admit")
	require.Zero(t, fake.Count(names[0])+fake.Count(names[1])+fake.Count(names[2])+fake.Count(names[3]),
		"ordered without the ledger")

	_, err = holder.Exec(b.ctx, `COMMIT`)
	require.NoError(t, err)
	workertest.Eventually(t, 30*time.Second, "every domain to be issued once the ledger answers", func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM proxy_domains WHERE ssl_status = 'active'`).Scan(&n))
		return n == 4
	})
	for _, n := range names {
		require.Equal(t, 1, fake.Count(n), fmt.Sprint("orders of ", n))
	}
}
