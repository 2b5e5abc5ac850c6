package main

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/netrelay"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// joinSignal is a probe's context that says when the probe waits for its answer:
// readiness.check asks for Done only once it has joined a check.
type joinSignal struct {
	context.Context
	once   sync.Once
	joined chan<- struct{}
}

func (j *joinSignal) Done() <-chan struct{} {
	j.once.Do(func() { j.joined <- struct{}{} })
	return j.Context.Done()
}

// Probes that come while a check runs share its answer: twenty probes, one check.
// The probe that started it gives up (its client went away), and the check runs on
// to its end for the others, its context not cancelled.
//
// Guards against a check per probe: after a failover each wanted a connection of
// its own while every new one first waited out the dead host, and the queue of
// probes kept an instance from answering ready within the 5 s a failover is given
// (docs/high-availability.md, "Failover").
func TestReadiness_ProbesThatComeWhileACheckRunsShareItsAnswer(t *testing.T) {
	const probes = 20
	var calls atomic.Int32
	entered, release := make(chan context.Context, probes), make(chan struct{})
	r := newReadiness(func(ctx context.Context) string {
		calls.Add(1)
		entered <- ctx
		<-release
		if ctx.Err() != nil {
			return "cancelled: " + ctx.Err().Error()
		}
		return "listener not connected"
	})

	first, abandon := context.WithCancel(context.Background())
	firstAnswer := make(chan string, 1)
	go func() { firstAnswer <- r.check(first) }()
	var checkCtx context.Context
	select {
	case checkCtx = <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first probe started no check")
	}

	joined := make(chan struct{}, probes)
	answers := make(chan string, probes)
	for range probes - 1 {
		go func() { answers <- r.check(&joinSignal{Context: context.Background(), joined: joined}) }()
	}
	for range probes - 1 {
		select {
		case <-joined:
		case <-time.After(10 * time.Second):
			t.Fatal("a probe neither joined the check under way nor answered")
		}
	}
	abandon()
	require.Equal(t, "readiness check abandoned: context canceled", <-firstAnswer)
	require.NoError(t, checkCtx.Err(), "the check was cancelled with the probe that started it")
	close(release)
	for range probes - 1 {
		require.Equal(t, "listener not connected", <-answers)
	}
	require.Equal(t, int32(1), calls.Load(), "checks run for %d probes", probes)

	// Once it ended, the next probe starts a check of its own.
	go func() { <-entered }()
	require.Equal(t, "listener not connected", r.check(context.Background()))
	require.Equal(t, int32(2), calls.Load())
}

// stubWorker is the worker as /readyz sees it.
type stubWorker struct {
	ready  bool
	halted error
}

func (s stubWorker) Ready() bool   { return s.ready }
func (s stubWorker) Halted() error { return s.halted }

// workerPool is the worker's pool for tests of /readyz: of one connection, warmed up
// as run's is, on dsn.
func workerPool(t *testing.T, dsn string, lease time.Duration) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.MaxConns = 1
	qc := issuing.DefaultConfig()
	qc.Lease = lease
	queue.ConfigureSession(cfg, queue.WorkerSessionFor(qc, "https://127.0.0.1:1/first"))
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// A check asks the database everything on the probes' own session (probeSession),
// kept from one check to the next: it answers, and both CAs' stored accounts are
// read on it (a check took three connections before); a halted worker or a listener
// not connected is reported with that session. The worker's pool is not touched:
// with its every connection held, as by an instance at work, the instance is ready.
// The session has the worker's bounds and none of its warm-up, and one whose server
// process ended is made again by the next check.
//
// Guards against the check waiting among the worker's steps for the worker's pool:
// five seconds after a promotion an instance of the failover test answered "no
// connection of the pool: 4 of 4 in use" while the database answered.
func TestReadiness_AChecksOnASessionOfItsOwn(t *testing.T) {
	t.Parallel()
	base, dsn := pgtest.NewPool(t)
	ctx := context.Background()
	issuer := func(directory string) *acme.Issuer {
		i, err := acme.New(ctx, base, zap.NewNop(), acme.Config{Recorder: queue.New(base, issuing.DefaultConfig()), DirectoryURL: directory, HTTPTimeout: time.Second})
		require.NoError(t, err)
		return i
	}
	first, second := issuer("https://127.0.0.1:1/first"), issuer("https://127.0.0.1:1/second")

	const lease = 40 * time.Second
	workers := workerPool(t, dsn, lease)
	held, err := workers.Acquire(ctx)
	require.NoError(t, err)
	defer held.Release()

	probes := newProbeSession(workers, lease)
	t.Cleanup(probes.Close)
	var pid uint32
	for _, tc := range []struct {
		wk   stubWorker
		want string
	}{
		{stubWorker{ready: true}, ""},
		{stubWorker{ready: false}, "listener not connected"},
		{stubWorker{ready: true, halted: errors.New("--acme-profile: not offered")}, "--acme-profile: not offered"},
	} {
		workersBefore := workers.Stat().AcquireCount()
		check, cancel := context.WithTimeout(ctx, readyTimeout)
		require.Equal(t, tc.want, notReady(check, probes, tc.wk, first, second))
		cancel()
		require.Equal(t, workersBefore, workers.Stat().AcquireCount(), "connections of the worker's pool taken by a check (%+v)", tc.wk)
		require.NotNil(t, probes.conn, "the probes' session after a check (%+v)", tc.wk)
		if pid == 0 {
			pid = probes.conn.PgConn().PID()
		}
		require.Equal(t, pid, probes.conn.PgConn().PID(), "the probes' session was made again (%+v)", tc.wk)
	}

	const claim = `SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%WITH head AS MATERIALIZED%' AND statement NOT LIKE '%pg_prepared_statements%'`
	var warmedClaims, claims int
	var statementTimeout, lockTimeout string
	require.NoError(t, held.QueryRow(ctx, claim).Scan(&warmedClaims))
	require.Equal(t, 1, warmedClaims, "the claim prepared by the warm-up of the worker's session")
	require.NoError(t, probes.conn.QueryRow(ctx, `SELECT (`+claim+`), current_setting('statement_timeout'), current_setting('lock_timeout')`).
		Scan(&claims, &statementTimeout, &lockTimeout))
	require.Zero(t, claims, "claims prepared on the probes' session (the worker's warm-up)")
	require.Equal(t, "10s", statementTimeout, "the probes' statement_timeout (a quarter of the lease)")
	require.Equal(t, "2s", lockTimeout, "the probes' lock_timeout")

	var ended bool
	require.NoError(t, base.QueryRow(ctx, `SELECT pg_terminate_backend($1::int, 5000)`, pid).Scan(&ended))
	require.True(t, ended)
	require.Empty(t, notReady(ctx, probes, stubWorker{ready: true}, first, second), "the check after the session's server process ended")
	require.NotEqual(t, pid, probes.conn.PgConn().PID(), "the session whose server process ended was kept")
}

// A kept session whose server went silent, as a primary that vanished does, costs
// the next check a ping's timeout (idlePingTimeout) and a new connection, to the
// next host of the URL, not the 15 s pgx takes to close a connection to a silent
// server: the first host's relay turns into a black hole (its connections stay open,
// nothing comes back), and the check after it answers ready through the second host
// within 5 s (readyTimeout), the bound a failover is given.
//
// Guards against a check that waits for the silent connection's close, which pgx
// gives up to 15 s (pgconn's asyncClose); a pool of the probes' own would keep its
// slot that long.
func TestReadiness_ASilentServerCostsTheNextCheckAPingNotAClose(t *testing.T) {
	t.Parallel()
	base, dsn := pgtest.NewPool(t)
	ctx := context.Background()
	first, err := acme.New(ctx, base, zap.NewNop(), acme.Config{Recorder: queue.New(base, issuing.DefaultConfig()), DirectoryURL: "https://127.0.0.1:1/first", HTTPTimeout: time.Second})
	require.NoError(t, err)

	cfg, err := pgconn.ParseConfig(dsn)
	require.NoError(t, err)
	server := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	dead, live := netrelay.Start(t, server), netrelay.Start(t, server)
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.Host = dead.Addr() + "," + live.Addr()

	const lease = 40 * time.Second
	probes := newProbeSession(workerPool(t, u.String(), lease), lease)
	t.Cleanup(probes.Close)
	require.Empty(t, notReady(ctx, probes, stubWorker{ready: true}, first, nil))
	require.Equal(t, dead.Addr(), probes.conn.PgConn().Conn().RemoteAddr().String(), "the session's first host")

	dead.Blackhole()
	checked := time.Now()
	check, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	require.Empty(t, notReady(check, probes, stubWorker{ready: true}, first, nil), "the check after the first host went silent")
	took := time.Since(checked)
	t.Logf("the check after the first host went silent answered ready in %s", took.Round(time.Millisecond))
	require.Equal(t, live.Addr(), probes.conn.PgConn().Conn().RemoteAddr().String(), "the new session's host")
}
