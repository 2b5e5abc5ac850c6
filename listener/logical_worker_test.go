package listener_test

// The logical waker driving the real worker (queue.Worker with a fake issuer), on
// servers started with wal_level=logical: the reliability tests the NOTIFY listener
// passes, in this mode. An external test package, because queue imports listener.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/queue"
)

// worker is one in-process instance as `certworker run --wake logical` wires it:
// its own pool, a Logical waker, the mode recorded, and the worker.
type worker struct {
	logs *observer.ObservedLogs
	done chan struct{}
}

func startLogicalWorker(t *testing.T, dsn string, issuer queue.Issuer, owner string) *worker {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	ctx, cancel := context.WithCancel(context.Background())
	lg := listener.NewLogical(pool, log, listener.Options{BackoffMin: 50 * time.Millisecond, BackoffMax: time.Second})
	require.NoError(t, lg.Start(ctx))
	_, err = listener.SetMode(ctx, pool, listener.ModeLogical)
	require.NoError(t, err)
	// An hour's poll: only the waker can explain a claim within a test.
	w := queue.NewWorker(queue.New(pool, queue.DefaultConfig()), issuer, lg.Wakes(), log, queue.WorkerConfig{
		Owner: owner, Concurrency: 4, PollInterval: time.Hour, Directory: "https://ca.invalid/directory",
	}, nil)
	in := &worker{logs: logs, done: make(chan struct{})}
	go func() { _ = w.Run(ctx); close(in.done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-in.done:
		case <-time.After(time.Minute):
			t.Error("worker did not stop")
		}
		lg.Stop()
		pool.Close()
	})
	// The start-up pass (the waker's first reconnect wake-up) must be over before a
	// test writes, or it, not the stream, may be what claims the test's domains.
	require.Eventually(t, func() bool { return logs.FilterMessage("pass finished").Len() > 0 },
		10*time.Second, 5*time.Millisecond, "the start-up pass did not finish")
	return in
}

// sources counts the sources of the orders this instance started.
func (w *worker) sources() map[string]int {
	out := map[string]int{}
	for _, e := range w.logs.FilterMessage("order started").All() {
		out[fmt.Sprint(e.ContextMap()["source"])]++
	}
	return out
}

type db struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	dsn    string
	tenant string
}

func newDB(t *testing.T, srv *pgtest.Server) *db {
	t.Helper()
	dsn := srv.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	d := &db{ctx: context.Background(), pool: pool, dsn: dsn}
	require.NoError(t, pool.QueryRow(d.ctx,
		"INSERT INTO proxy_tenants (name, slug, email) VALUES ('t', 't', 't@example.com') RETURNING id").Scan(&d.tenant))
	return d
}

// insert inserts n domains named prefix1.example... with the given verification
// status, in one statement.
func (d *db) insert(t *testing.T, prefix string, n int, verification string) {
	t.Helper()
	_, err := d.pool.Exec(d.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
SELECT $1, $2 || g || '.example', $3, 'tok', 'pending', 'acme' FROM generate_series(1, $4::int) g`,
		d.tenant, prefix, verification, n)
	require.NoError(t, err)
}

func (d *db) active(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, d.pool.QueryRow(d.ctx, `SELECT count(*) FROM proxy_domains WHERE ssl_status = 'active'`).Scan(&n))
	return n
}

func waitActive(t *testing.T, d *db, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := d.active(t)
		if got == n {
			return
		}
		require.True(t, time.Now().Before(deadline), "timed out after %s: %d of %d domains active", timeout, got, n)
		time.Sleep(20 * time.Millisecond)
	}
}

func requireOncePerDomain(t *testing.T, fake *fakeissuer.Issuer, n int) {
	t.Helper()
	counts := fake.Counts()
	require.Len(t, counts, n)
	for d, c := range counts {
		require.Equal(t, 1, c, "%s ordered %d times", d, c)
	}
}

func TestLogicalWorker(t *testing.T) {
	t.Parallel()
	srv := pgtest.StartServer(t, "wal_level=logical", "max_replication_slots=20", "max_wal_senders=20")

	// Three instances on the logical waker, 500 domains verified in one
	// transaction: every domain is issued exactly once, within seconds although
	// the poll is an hour away, and with the trigger not notifying (the mode is
	// logical), so the stream is what woke them. Guards against a waker that
	// misses a bulk change, and against wake-ups that multiply orders: the claim
	// query keeps the instances apart whatever wakes them.
	t.Run("ThreeInstancesIssueEachDomainExactlyOnce", func(t *testing.T) {
		t.Parallel()
		d := newDB(t, srv)
		fake := fakeissuer.New(1)
		fake.Delay = 2 * time.Millisecond
		var ws []*worker
		for i := range 3 {
			ws = append(ws, startLogicalWorker(t, d.dsn, fake, fmt.Sprint("w", i)))
		}
		d.insert(t, "many", 500, "pending")
		// Let every start-up pass finish, so that none of them can be what
		// claims the domains.
		for _, w := range ws {
			require.Eventually(t, func() bool { return w.logs.FilterMessage("pass finished").Len() > 0 },
				10*time.Second, 10*time.Millisecond)
		}
		_, err := d.pool.Exec(d.ctx, `UPDATE proxy_domains SET verification_status = 'verified'`)
		require.NoError(t, err)
		waitActive(t, d, 500, 60*time.Second)
		requireOncePerDomain(t, fake, 500)
		total := map[string]int{}
		for _, w := range ws {
			for s, n := range w.sources() {
				total[s] += n
			}
		}
		t.Logf("orders by wake-up source: %v", total)
		require.Zero(t, total[listener.SourcePoll], "the poll is an hour away")
		require.Positive(t, total[listener.SourceNotify], "the stream's wake-up must start the work")
	})

	// The stream is cut (its WAL sender terminated) and domains are queued while
	// the waker is away: none of them is lost. They are not in the stream the new
	// connection reads, since its slot starts where it was created; the
	// reconnection's catch-up pass finds them. Guards against a reconnection that
	// trusts the stream to replay what it missed (a temporary slot cannot), and
	// against a catch-up wake-up sent before the new stream is in place.
	t.Run("ChangesWhileTheStreamIsDownAreNotLost", func(t *testing.T) {
		t.Parallel()
		d := newDB(t, srv)
		fake := fakeissuer.New(1)
		w := startLogicalWorker(t, d.dsn, fake, "w")
		require.Eventually(t, func() bool { return w.logs.FilterMessage("pass finished").Len() > 0 },
			10*time.Second, 10*time.Millisecond)

		var pid int32
		require.NoError(t, d.pool.QueryRow(d.ctx,
			`SELECT active_pid FROM pg_replication_slots WHERE database = current_database()`).Scan(&pid))
		_, err := d.pool.Exec(d.ctx, `SELECT pg_terminate_backend($1)`, pid)
		require.NoError(t, err)
		// Queued one by one, racing the reconnection (50 ms to 1 s away).
		for i := range 20 {
			d.insert(t, fmt.Sprintf("gap%d-", i), 1, "verified")
			time.Sleep(10 * time.Millisecond)
		}
		waitActive(t, d, 20, 30*time.Second)
		requireOncePerDomain(t, fake, 20)
		require.Positive(t, w.logs.FilterMessage("listener reconnected").Len())
		t.Logf("orders by wake-up source: %v", w.sources())
		require.Zero(t, w.sources()[listener.SourcePoll], "the poll is an hour away")
	})
}

// The database restarts under a running worker on the logical waker (a minor
// upgrade, a failover): the temporary slot goes with the server, the waker must ride
// out the outage, reconnect on a new slot, and the worker issue what was queued
// around the restart, each domain once, without waiting for the poll. Guards
// against a waker that gives up on its connection, and against one that tries to
// resume a slot that no longer exists.
func TestLogicalWorker_SurvivesADatabaseRestart(t *testing.T) {
	t.Parallel()
	srv := pgtest.StartServer(t, "wal_level=logical")
	d := newDB(t, srv)
	fake := fakeissuer.New(1)
	w := startLogicalWorker(t, d.dsn, fake, "w")

	d.insert(t, "before", 1, "verified")
	waitActive(t, d, 1, 10*time.Second)
	require.Equal(t, map[string]int{listener.SourceNotify: 1}, w.sources(), "issued through the stream")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, srv.Stop(ctx))
	require.Eventually(t, func() bool { return w.logs.FilterMessage("listener connection lost").Len() > 0 },
		15*time.Second, 10*time.Millisecond, "the waker never saw the outage")
	time.Sleep(2 * time.Second) // an outage, with reconnections failing
	select {
	case <-w.done:
		t.Fatal("the worker exited while the database was down")
	default:
	}

	require.NoError(t, srv.Start(ctx))
	up := time.Now()
	// Queued at once, racing the waker's reconnection (at most 1 s away).
	for i := range 20 {
		d.insert(t, fmt.Sprintf("after%d-", i), 1, "verified")
		time.Sleep(20 * time.Millisecond)
	}
	waitActive(t, d, 21, 30*time.Second)
	t.Logf("all issued %s after the database answered again; orders by source: %v", time.Since(up), w.sources())
	requireOncePerDomain(t, fake, 21)
	require.Zero(t, w.sources()[listener.SourcePoll], "the poll is an hour away")

	back := w.logs.FilterMessage("listener reconnected").All()
	require.NotEmpty(t, back, "no reconnection logged")
	require.Equal(t, listener.ModeLogical, back[0].ContextMap()["mode"])
	var slots int
	require.NoError(t, d.pool.QueryRow(d.ctx,
		`SELECT count(*) FROM pg_replication_slots WHERE database = current_database() AND temporary`).Scan(&slots))
	require.Equal(t, 1, slots, "streaming again, from a new temporary slot")
}
