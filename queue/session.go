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
// long the server keeps working, or waiting, for a client that may be gone. A zero
// field leaves the server's setting (by default: no bound).
type Session struct {
	// StatementTimeout bounds each statement. A client that gave up on a statement
	// (its context ended: the worker's step deadline) only closes its end; across a
	// partition the server never hears of it, and without this bound would run the
	// statement to its end.
	StatementTimeout time.Duration
	// LockTimeout bounds each wait for a lock. A statement of ours that queues for a
	// lock makes everything that wants the lock after it queue behind it, the proxy's
	// writes included; giving up and trying again bounds that.
	LockTimeout time.Duration
	// IdleInTransactionTimeout ends a session whose transaction waits for its client
	// (idle_in_transaction_session_timeout): a client cut off between a lock and its
	// COMMIT would otherwise hold the lock for as long as the server keeps the
	// connection, hours with the default TCP keepalives.
	IdleInTransactionTimeout time.Duration
	// Warm, when set, readies each new session for the statements it will run, after
	// the settings (Queue.WarmUp, for the worker's pool: WorkerSessionFor). Its error
	// is not the session's: a session it could not warm is used all the same, unless
	// the connection itself broke.
	Warm func(ctx context.Context, conn *pgx.Conn) error
}

// The worker's session bounds (WorkerSession).
const (
	// workerLockTimeout: the proxy's own statements hold their row locks for
	// milliseconds; a lock held for two seconds belongs to a transaction that is open
	// for longer (a tenant's form, a stuck session), and a statement of ours gives up
	// and is retried rather than queue behind it, with the proxy's writes queued
	// behind ours. The same value as migrate's --lock-timeout, for the same reason.
	workerLockTimeout = 2 * time.Second
	// workerIdleInTransaction: no transaction of the worker's waits for anything
	// between its statements (nothing on the network outside the database, no
	// user), so a transaction idle for this long has lost its client. Ten seconds
	// frees the ledger's lock, held by an instance cut off mid-transaction, inside
	// the step (a quarter lease, 15 s by default) of the instances waiting for it.
	workerIdleInTransaction = 10 * time.Second
)

// WorkerSession is the worker's: each statement bounded by the worker's step deadline
// (a quarter of the lease, worker.Worker's stepTimeout), so that the server stops
// what the worker stopped waiting for; lock waits of two seconds; and a transaction
// whose client went quiet for ten seconds ended by the server. Steps that run a
// transaction set tighter bounds of their own inside it (Admit, SettleLedger).
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

// WorkerSessionFor is WorkerSession for cfg's lease, with each new session warmed up
// for the wake path of a worker with cfg's settings and the CA at directory
// (Queue.WarmUp).
func WorkerSessionFor(cfg issuing.Config, directory string) Session {
	s := WorkerSession(cfg.Lease)
	s.Warm = func(ctx context.Context, conn *pgx.Conn) error { return New(conn, cfg).WarmUp(ctx, conn, directory) }
	return s
}

// ConfigurePool sets up the sessions of a pool that the queue's statements run in
// with the worker's bounds at the default lease (WorkerSession): ConfigureSession.
func ConfigurePool(cfg *pgxpool.Config) { ConfigureSession(cfg, WorkerSession(issuing.DefaultLease)) }

// HostConnectTimeout bounds a pool's connection to one host (dial, TLS,
// authentication) where its connection string sets no connect_timeout. pgx applies
// it to each host of a multi-host URL in turn, so that a primary that died and is
// listed first costs a new connection 2 s before the next host, the promoted
// standby, is asked: the pool is back within the 5 s a failover is
// given, as the wake listener is (listener.DefaultHostConnectTimeout, the same
// figure). A live server on a loaded host answers in milliseconds.
const HostConnectTimeout = 2 * time.Second

// ConfigureSession sets up the sessions of a pool, keeping the pool's own
// AfterConnect hook: JIT compilation off, and s's bounds; and a connection to each
// host bounded by HostConnectTimeout where the connection string sets none.
//
// JIT: the queue's statements are short and run often, but their estimated cost at a
// million rows (the claim's correlated look-ups, counted once for every row the
// planner thinks it may read) crosses jit_above_cost, and compiling the claim took
// 36 ms of its 38 (bench/plans.txt).
//
// A SET after connecting rather than a startup parameter, which a pooler such as
// PgBouncer refuses ("unsupported startup parameter"); the proxy's sessions keep
// their own settings. One round trip: the settings go in one simple-protocol string.
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
