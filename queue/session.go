package queue

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Session is what ConfigureSession sets on every session of a pool: bounds on how
// long the server works or waits for a client that may be gone (zero: the server's).
type Session struct {
	// StatementTimeout bounds each statement: across a partition the server never
	// hears that the client gave up.
	StatementTimeout time.Duration
	// LockTimeout bounds each lock wait, which queues the proxy's writes behind it.
	LockTimeout time.Duration
	// IdleInTransactionTimeout ends a transaction whose client is gone, and its locks.
	IdleInTransactionTimeout time.Duration
	// Warm, when set, readies each new session (Queue.WarmUp); a failure leaves it usable.
	Warm func(ctx context.Context, conn *pgx.Conn) error
}

// The worker's session bounds (WorkerSession).
const (
	// workerLockTimeout: the proxy holds row locks for milliseconds, so a lock held two
	// seconds belongs to a long-open transaction; ours gives up and retries rather than
	// queue the proxy's writes behind it.
	workerLockTimeout = 2 * time.Second
	// workerIdleInTransaction: no worker transaction waits between its statements, so
	// one idle this long has lost its client; it frees the ledger's lock within a step.
	workerIdleInTransaction = 10 * time.Second
)

// WorkerSession is the worker's: statements bounded by the step deadline (a quarter
// lease), two-second lock waits, ten seconds idle in a transaction.
func WorkerSession(lease time.Duration) Session {
	if lease <= 0 {
		lease = issuing.DefaultLease
	}
	return Session{
		StatementTimeout:         lease / 4,
		LockTimeout:              workerLockTimeout,
		IdleInTransactionTimeout: workerIdleInTransaction,
	}
}

// WorkerSessionFor is WorkerSession for cfg's lease, warming each new session for
// the wake path.
func WorkerSessionFor(cfg issuing.Config, directory string) Session {
	s := WorkerSession(cfg.Lease)
	s.Warm = func(ctx context.Context, conn *pgx.Conn) error { return New(conn, cfg).WarmUp(ctx, conn, directory) }
	return s
}

// ConfigurePool sets up a pool's sessions with WorkerSession at the default lease.
func ConfigurePool(cfg *pgxpool.Config) { ConfigureSession(cfg, WorkerSession(issuing.DefaultLease)) }

// HostConnectTimeout bounds a connection to one host where the connection string
// sets no connect_timeout: pgx tries each host of a multi-host URL in turn, so a dead
// primary listed first costs 2 s, within a failover's 5 s.
const HostConnectTimeout = 2 * time.Second

// ConfigureSession sets up the sessions of a pool, keeping its AfterConnect: JIT off
// (docs/internals.md, Claim), s's bounds, HostConnectTimeout, and the deadline grace
// of WithDeadlineGrace. SET after connecting, since PgBouncer refuses startup
// parameters; one round trip.
func ConfigureSession(cfg *pgxpool.Config, s Session) {
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = HostConnectTimeout
	}
	cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &graceHandler{conn: c.Conn(), grace: s.StatementTimeout}
	}
	prev := cfg.AfterConnect
	set := s.sql()
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if prev != nil {
			if err := prev(ctx, conn); err != nil {
				return err
			}
		}
		if _, err := conn.Exec(ctx, set, pgx.QueryExecModeSimpleProtocol); err != nil {
			return fmt.Errorf("set up the session: %w", err)
		}
		if s.Warm != nil && ctx.Value(sessionOfItsOwn{}) == nil {
			if err := s.Warm(ctx, conn); err != nil && conn.IsClosed() {
				return fmt.Errorf("set up the session: %w", err)
			}
		}
		return nil
	}
}

func (s Session) sql() string {
	set := "SET jit = off"
	for _, p := range []struct {
		name string
		d    time.Duration
	}{
		{"statement_timeout", s.StatementTimeout},
		{"lock_timeout", s.LockTimeout},
		{"idle_in_transaction_session_timeout", s.IdleInTransactionTimeout},
	} {
		if p.d > 0 {
			set += fmt.Sprintf("; SET %s = %d", p.name, max(p.d.Milliseconds(), 1))
		}
	}
	return set
}

// NewPool is pgxpool.New with ConfigurePool's sessions.
func NewPool(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	return NewPoolWith(ctx, dsn, WorkerSession(issuing.DefaultLease))
}

// NewPoolWith is pgxpool.New with ConfigureSession's sessions.
func NewPoolWith(ctx context.Context, dsn string, s Session) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	ConfigureSession(cfg, s)
	return pgxpool.NewWithConfig(ctx, cfg)
}

// sessionOfItsOwn marks the context of ConnectSession's set-up: such a session is
// not warmed up (Session.Warm).
type sessionOfItsOwn struct{}

// SessionOfItsOwn marks ctx as that of the set-up (a pool's AfterConnect) of a session
// outside the pool, as ConnectSession's: it is not warmed up for the wake path, whose
// statements it never runs. The listener's session is one: on a busy server its
// warm-up kept the listener's connect from finishing within its ConnectTimeout.
func SessionOfItsOwn(ctx context.Context) context.Context {
	return context.WithValue(ctx, sessionOfItsOwn{}, true)
}

// ConnectSession opens a session outside the pool cfg configures, set up as the
// pool's are but not warmed up for the wake path: the heartbeat's and the readiness
// probe's sessions run their own statements, none of the wake path's. The warm-up
// plans those statements six times each, about 0.1 s of the server's time, and on a
// busy server it can take longer than a lease, which the heartbeat's first renewal
// cannot wait for. One whose set-up failed is closed.
func ConnectSession(ctx context.Context, cfg *pgxpool.Config) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		return nil, err
	}
	if cfg.AfterConnect != nil {
		if err := cfg.AfterConnect(SessionOfItsOwn(ctx), conn); err != nil {
			CloseQuickly(conn)
			return nil, err
		}
	}
	return conn, nil
}

// CloseQuickly closes a session of its own, giving the goodbye a second at most.
func CloseQuickly(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// deadlineGrace is the context key of WithDeadlineGrace.
type deadlineGrace struct{}

// WithDeadlineGrace marks ctx as a worker step's: a statement on a session that
// ConfigureSession set up, still running when ctx's deadline passes, is given the
// session's StatementTimeout more to answer before its connection is closed, so that
// the server ends the statement (SQLSTATE 57014) and the session survives: its
// connection, its caches and its prepared statements, which a new session must build
// again. pgx's default is to close the connection at the deadline, and on a busy
// server that spirals: each step that ran out closed a session, the next step waited
// for a new one and ran its statement cold, and ran out again (a worker with a 3 s
// lease saw every step fail for 15 s). The connection is still closed at once when
// ctx is cancelled (a shutdown, a stopped order), and when the server has not
// answered within the grace (gone, or cut off): every wait stays bounded, by the
// deadline plus the statement_timeout. A context without the mark (a command, the
// listener's wait, a readiness probe), or a session without a statement_timeout,
// keeps pgx's default.
func WithDeadlineGrace(ctx context.Context) context.Context {
	return context.WithValue(ctx, deadlineGrace{}, true)
}

// graceHandler is the pgconn context handler of ConfigureSession's sessions: pgx's
// own (the connection's deadline set when the context ends), later by grace when the
// context was marked by WithDeadlineGrace and its deadline passed.
type graceHandler struct {
	conn  net.Conn
	grace time.Duration
}

func (h *graceHandler) HandleCancel(ctx context.Context) {
	var wait time.Duration
	if ctx.Value(deadlineGrace{}) != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		wait = h.grace
	}
	_ = h.conn.SetDeadline(time.Now().Add(wait))
}

func (h *graceHandler) HandleUnwatchAfterCancel() { _ = h.conn.SetDeadline(time.Time{}) }
