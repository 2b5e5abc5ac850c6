package queue

import (
	"context"
	"fmt"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Session is what ConfigureSession sets on every session of a pool: bounds on how
// long the server works or waits for a client that may be gone. A zero field leaves
// the server's setting.
type Session struct {
	// StatementTimeout bounds each statement: across a partition the server never hears
	// that the client gave up.
	StatementTimeout time.Duration
	// LockTimeout bounds each lock wait: a statement queued for a lock queues the
	// proxy's writes behind it.
	LockTimeout time.Duration
	// IdleInTransactionTimeout ends a session whose transaction waits for its client,
	// which could otherwise hold its locks for hours.
	IdleInTransactionTimeout time.Duration
	// Warm, when set, readies each new session after the settings (Queue.WarmUp). A
	// session it could not warm is used all the same, unless the connection broke.
	Warm func(ctx context.Context, conn *pgx.Conn) error
}

// The worker's session bounds (WorkerSession).
const (
	// workerLockTimeout: the proxy holds row locks for milliseconds, so a lock held two
	// seconds belongs to a long-open transaction; ours gives up and retries rather than
	// queue the proxy's writes behind it. Same as migrate's --lock-timeout.
	workerLockTimeout = 2 * time.Second
	// workerIdleInTransaction: no worker transaction waits on anything between its
	// statements, so one idle this long has lost its client. It frees the ledger's lock
	// within the step of the instances waiting for it.
	workerIdleInTransaction = 10 * time.Second
)

// WorkerSession is the worker's: each statement bounded by the worker's step
// deadline (a quarter lease), two-second lock waits, and ten seconds idle in a
// transaction. Some steps set tighter bounds inside their transaction.
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

// WorkerSessionFor is WorkerSession for cfg's lease, with each new session warmed
// up for the wake path (Queue.WarmUp).
func WorkerSessionFor(cfg issuing.Config, directory string) Session {
	s := WorkerSession(cfg.Lease)
	s.Warm = func(ctx context.Context, conn *pgx.Conn) error { return New(conn, cfg).WarmUp(ctx, conn, directory) }
	return s
}

// ConfigurePool sets up a pool's sessions with WorkerSession at the default lease.
func ConfigurePool(cfg *pgxpool.Config) { ConfigureSession(cfg, WorkerSession(issuing.DefaultLease)) }

// HostConnectTimeout bounds a pool's connection to one host where the connection
// string sets no connect_timeout. pgx applies it to each host of a multi-host URL in
// turn, so a dead primary listed first costs 2 s before the promoted standby is
// asked, within a failover's 5 s (as listener.DefaultHostConnectTimeout).
const HostConnectTimeout = 2 * time.Second

// ConfigureSession sets up the sessions of a pool, keeping the pool's AfterConnect:
// JIT off, s's bounds, and HostConnectTimeout where the connection string sets none.
//
// JIT off: the statements are short, but their estimated cost at a million rows
// crosses jit_above_cost, and compiling would take most of the claim's time.
//
// A SET after connecting, not a startup parameter, which PgBouncer refuses; one round
// trip in one simple-protocol string.
func ConfigureSession(cfg *pgxpool.Config, s Session) {
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = HostConnectTimeout
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
		if s.Warm != nil {
			if err := s.Warm(ctx, conn); err != nil && conn.IsClosed() {
				return fmt.Errorf("set up the session: %w", err)
			}
		}
		return nil
	}
}

// sql is the SET statements for s.
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

// ConnectSession opens a session of its own, outside the pool cfg configures, set up
// as the pool's are (its AfterConnect: the session's bounds, a warm-up if it has
// one). A session whose set-up failed is closed (CloseQuickly).
func ConnectSession(ctx context.Context, cfg *pgxpool.Config) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		return nil, err
	}
	if cfg.AfterConnect != nil {
		if err := cfg.AfterConnect(ctx, conn); err != nil {
			CloseQuickly(conn)
			return nil, err
		}
	}
	return conn, nil
}

// CloseQuickly closes a session of its own (not a pool's) without waiting on a server
// that may not answer: the goodbye gets a second, then the socket is closed anyway.
func CloseQuickly(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}
