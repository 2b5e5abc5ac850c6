package worker_test

// The logical waker driving the real worker, on servers started with
// wal_level=logical: the reliability tests the NOTIFY listener passes, in this mode.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// startLogicalWorker runs an instance as `certworker run --wake logical` runs it, with
// an hour's poll, so that only the wake source can explain a claim within a test, and
// waits for its start-up pass to be over: a test that writes before then could see
// that pass, not the stream, claim its domains.
func startLogicalWorker(t *testing.T, dsn string, issuer issuing.Issuer, name string) *workertest.Instance {
	t.Helper()
	w := workertest.Start(t, dsn, name, worker.Config{
		Issuer: issuer, Wake: issuing.WakeLogical, Concurrency: 4, PollInterval: time.Hour,
	})
	w.WaitForLog(t, "pass finished", 1, 10*time.Second)
	return w
}

// sources counts the sources of the orders an instance started.
func sources(w *workertest.Instance) map[string]int {
	out := map[string]int{}
	for _, e := range w.Logs.FilterMessage("order started").All() {
		out[fmt.Sprint(e.ContextMap()["source"])]++
	}
	return out
}

type db struct {
	*bundle
	tenant string
}

func newDB(t *testing.T, srv *pgtest.Server) *db {
	t.Helper()
	pool, dsn := srv.NewPool(t)
	b := &bundle{ctx: context.Background(), pool: pool, dsn: dsn}
	return &db{bundle: b, tenant: b.tenant(t)}
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
	workertest.Eventually(t, timeout, fmt.Sprintf("%d domains active", n), func() bool { return d.active(t) == n })
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
		var ws []*workertest.Instance
		for i := range 3 {
			ws = append(ws, startLogicalWorker(t, d.dsn, fake, fmt.Sprint("w", i)))
		}
		d.insert(t, "many", 500, "pending")
		// Let every start-up pass finish, so that none of them can be what
		// claims the domains.
		for _, w := range ws {
			w.WaitForLog(t, "pass finished", 1, 10*time.Second)
		}
		_, err := d.pool.Exec(d.ctx, `UPDATE proxy_domains SET verification_status = 'verified'`)
		require.NoError(t, err)
		waitActive(t, d, 500, 60*time.Second)
		requireOncePerDomain(t, fake, 500)
		total := map[string]int{}
		for _, w := range ws {
			for s, n := range sources(w) {
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
		w.WaitForLog(t, "pass finished", 1, 10*time.Second)

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
		require.Positive(t, w.Logs.FilterMessage("listener reconnected").Len())
		t.Logf("orders by wake-up source: %v", sources(w))
		require.Zero(t, sources(w)[listener.SourcePoll], "the poll is an hour away")
	})
}

// A commit is streamed once it is in the WAL, a moment before a new snapshot sees it
// (longer on a busy machine, where the committing backend can be descheduled in
// between). Here a synchronous standby that never answers holds that moment open:
// the insert's commit is streamed, and its wake-up's pass, and the look 5 ms later,
// see nothing. The worker keeps looking, doubling from 5 ms, until its snapshot sees
// the announced transaction end, and claims the domain then, not at the poll an hour
// away. Guards against a worker that takes "nothing due" from a snapshot that could
// not yet see what woke it.
func TestLogicalWorker_ACommitStreamedBeforeItIsVisibleIsClaimedWithoutThePoll(t *testing.T) {
	t.Parallel()
	// Only the session that asks for synchronous_commit = on waits for the standby.
	srv := pgtest.StartServer(t, "wal_level=logical", "synchronous_standby_names=nobody", "synchronous_commit=local")
	d := newDB(t, srv)
	fake := fakeissuer.New(1)
	w := startLogicalWorker(t, d.dsn, fake, "w")

	conn, err := d.pool.Acquire(d.ctx)
	require.NoError(t, err)
	defer conn.Release()
	var pid int32
	_, err = conn.Exec(d.ctx, `SET synchronous_commit = on`)
	require.NoError(t, err)
	require.NoError(t, conn.QueryRow(d.ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	inserted := make(chan error, 1)
	go func() {
		_, err := conn.Exec(d.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
VALUES ($1, 'held.example', 'verified', 'tok', 'pending', 'acme')`, d.tenant)
		inserted <- err
		close(inserted)
	}()
	// On a failure below, the insert still waits: end it before its connection goes.
	defer func() {
		_, _ = d.pool.Exec(context.Background(), `SELECT pg_cancel_backend($1)`, pid)
		<-inserted
	}()

	// The stream's wake-up, then three more looks, all while the commit is not visible.
	var looks []map[string]any
	workertest.Eventually(t, 10*time.Second, "the stream's wake-up and three looks after it", func() bool {
		looks = looks[:0]
		for _, e := range w.Logs.FilterMessage("pass finished").All() {
			f := e.ContextMap()
			if f["source"] == listener.SourceNotify || len(looks) > 0 {
				looks = append(looks, f)
			}
		}
		return len(looks) >= 4
	})
	require.Zero(t, d.active(t), "the insert is not visible while the standby has not answered")
	for i, f := range looks[:4] {
		require.Equal(t, int64(0), f["claimed"], "look %d: %v", i, f)
		require.Equal(t, listener.SourceTimer, f["next_source"], "look %d looks again, not at the poll: %v", i, f)
		require.Less(t, f["next_in"], time.Second, "look %d: %v", i, f)
	}

	// Cancelling the wait for the standby ends the transaction, committed.
	_, err = d.pool.Exec(d.ctx, `SELECT pg_cancel_backend($1)`, pid)
	require.NoError(t, err)
	require.NoError(t, <-inserted)
	waitActive(t, d, 1, 10*time.Second)
	got := sources(w)
	require.Zero(t, got[listener.SourcePoll], "the poll is an hour away")
	require.Equal(t, 1, got[listener.SourceTimer], "claimed by a look after the wake-up: %v", got)
	requireOncePerDomain(t, fake, 1)
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
	// Claimed by the stream's wake-up, or by a look after it when its pass's snapshot
	// did not see the change yet (the stream can run a moment ahead of visibility;
	// TestLogicalWorker_ACommitStreamedBeforeItIsVisibleIsClaimedWithoutThePoll). With
	// nothing else due, no other timer is set; the poll is an hour away.
	got := sources(w)
	require.Zero(t, got[listener.SourcePoll], "the poll is an hour away")
	require.Equal(t, 1, got[listener.SourceNotify]+got[listener.SourceTimer], "issued through the stream: %v", got)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, srv.Stop(ctx))
	require.Eventually(t, func() bool { return w.Logs.FilterMessage("listener connection lost").Len() > 0 },
		15*time.Second, 10*time.Millisecond, "the waker never saw the outage")
	time.Sleep(2 * time.Second) // an outage, with reconnections failing
	require.True(t, w.Running(), "the worker exited while the database was down")

	require.NoError(t, srv.Start(ctx))
	up := time.Now()
	// Queued at once, racing the waker's reconnection (at most 1 s away).
	for i := range 20 {
		d.insert(t, fmt.Sprintf("after%d-", i), 1, "verified")
		time.Sleep(20 * time.Millisecond)
	}
	waitActive(t, d, 21, 30*time.Second)
	t.Logf("all issued %s after the database answered again; orders by source: %v", time.Since(up), sources(w))
	requireOncePerDomain(t, fake, 21)
	require.Zero(t, sources(w)[listener.SourcePoll], "the poll is an hour away")

	back := w.Logs.FilterMessage("listener reconnected").All()
	require.NotEmpty(t, back, "no reconnection logged")
	require.Equal(t, issuing.WakeLogical, back[0].ContextMap()["mode"])
	var slots int
	require.NoError(t, d.pool.QueryRow(d.ctx,
		`SELECT count(*) FROM pg_replication_slots WHERE database = current_database() AND temporary`).Scan(&slots))
	require.Equal(t, 1, slots, "streaming again, from a new temporary slot")
}
