package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/queue"
)

// sessionPool is a pool of one session set up by queue.ConfigureSession with
// statementTimeout, on the test's database.
func sessionPool(t *testing.T, b *bundle, statementTimeout time.Duration) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.dsn)
	require.NoError(t, err)
	cfg.MaxConns = 1
	cfg.ConnConfig.ConnectTimeout = pgtest.ConnectTimeout // the test's hand, not the worker's bound
	queue.ConfigureSession(cfg, queue.Session{StatementTimeout: statementTimeout})
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func backendPID(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var pid int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid))
	return pid
}

// A worker step's statement still running at the step's deadline is ended by the
// server's own statement_timeout within the grace, and the session survives: the
// next statement runs in the same server process. Guards against pgx's default,
// which closed the connection at the deadline, so that each step that ran out on a
// busy server left the next one a new, cold session (a worker with a 3 s lease saw
// every step fail for 15 s).
func TestSession_AStepPastItsDeadlineIsEndedByTheServerAndKeepsItsSession(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const step = time.Second
	pool := sessionPool(t, b, step)
	pid := backendPID(t, pool)

	ctx, cancel := context.WithTimeout(queue.WithDeadlineGrace(b.ctx), step)
	defer cancel()
	start := time.Now()
	_, err := pool.Exec(ctx, `SELECT pg_sleep(10)`)
	took := time.Since(start)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "the server's answer, not the client's cut: %v", err)
	require.Equal(t, "57014", pgErr.Code, "statement_timeout: %v", err)
	require.Less(t, took, 2*step+time.Second, "bounded by the deadline and the grace")
	require.GreaterOrEqual(t, took, step, "ended before its deadline")
	require.Equal(t, pid, backendPID(t, pool), "the session was closed and a new one opened")
}

// Without the grace (a command's statement, the listener's wait, a readiness probe),
// and with it when the caller cancels (a shutdown, a stopped order), the connection
// is closed at once, as pgx does: nothing waits for the server.
func TestSession_ACancelOrAnUnmarkedDeadlineClosesTheSessionAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const statementTimeout = 5 * time.Second
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"a deadline without the grace", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(b.ctx, 200*time.Millisecond)
		}, context.DeadlineExceeded},
		{"a cancel with the grace", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(queue.WithDeadlineGrace(b.ctx))
			time.AfterFunc(200*time.Millisecond, cancel)
			return ctx, cancel
		}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := sessionPool(t, b, statementTimeout)
			pid := backendPID(t, pool)
			ctx, cancel := tc.ctx()
			defer cancel()
			start := time.Now()
			_, err := pool.Exec(ctx, `SELECT pg_sleep(10)`)
			took := time.Since(start)
			require.True(t, errors.Is(err, tc.want), "want %v, got %v", tc.want, err)
			require.Less(t, took, 2*time.Second, "waited for the server's statement_timeout of %s", statementTimeout)
			require.NotEqual(t, pid, backendPID(t, pool), "the session was kept")
		})
	}
}
