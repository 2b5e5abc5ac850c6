package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
)

// Result is one migration that Up ran.
type Result struct {
	Version  int64
	Source   string
	Duration string
}

// DefaultLockTimeout is how long any one statement of a migration may wait for a lock
// (`migrate --lock-timeout`). While a DDL statement waits for its lock, every write
// of the proxy's to the same table queues behind it: this bounds that queue. Two
// seconds is longer than the proxy's own statements hold their locks, and short
// enough that a tenant's "verify" does not time out behind it.
const DefaultLockTimeout = 2 * time.Second

// NoLockTimeout waits as long as it takes: what migrate did before --lock-timeout.
// Only for measuring that; it lets the proxy's writes queue for as long as its
// longest transaction lasts.
const NoLockTimeout = time.Duration(-1)

// defaultAttempts is how many times a migration whose statement gave up waiting for a
// lock is tried in all. With the backoff below that is about six minutes of retries:
// enough to outlast any transaction of the proxy's, short enough that a migrate stuck
// behind something that never ends says so.
const defaultAttempts = 30

// Backoff between attempts: doubling from retryBase to retryMax, with a fifth of
// jitter so that several instances retrying at once do not queue at the same moment.
const (
	retryBase = 250 * time.Millisecond
	retryMax  = 15 * time.Second
)

// Options are Up's settings; the zero value is the default.
type Options struct {
	// LockTimeout bounds every statement's wait for a lock: 0 is DefaultLockTimeout,
	// NoLockTimeout waits for ever.
	LockTimeout time.Duration
	// Attempts is how many times a migration is tried when a statement gives up
	// waiting for a lock (0: 30).
	Attempts int
	// OnRetry, when set, hears of every retry before its wait.
	OnRetry func(Retry)
	// OnNotice, when set, hears of what Up chose not to do and of what the operator
	// should know (the database's functions left alone because a newer binary
	// applied them).
	OnNotice func(string)
	// Release is the release to migrate to; nil is this binary's (Current). Tests
	// migrate to a synthetic next release with it.
	Release *Release
}

// Retry is a statement that gave up waiting for a lock and is about to be retried.
type Retry struct {
	// Attempt is the attempt that failed, from 1.
	Attempt int
	// Wait is the pause before the next attempt.
	Wait time.Duration
	// Err is what the statement returned (SQLSTATE 55P03 or 40P01).
	Err error
}

func (o Options) withDefaults() Options {
	if o.LockTimeout == 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	if o.Attempts <= 0 {
		o.Attempts = defaultAttempts
	}
	if o.Release == nil {
		rel := Current()
		o.Release = &rel
	}
	return o
}

// Apply brings the database at databaseURL up to the newest embedded migration, with
// the default Options.
func Apply(ctx context.Context, databaseURL string) ([]Result, error) {
	cfg, err := stdlibConfig(databaseURL)
	if err != nil {
		return nil, err
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	return Up(ctx, db, Options{})
}

// ApplyDB is Up with the default Options.
func ApplyDB(ctx context.Context, db *sql.DB) ([]Result, error) {
	return Up(ctx, db, Options{})
}

// Up brings the database up to the newest embedded migration, online: the proxy keeps
// reading and writing its tables throughout.
//
//   - Several instances may run it at once: each holds a session advisory lock for
//     its whole run (goose's lock id, so an older certworker's migrate waits too), and
//     the second finds nothing left to do.
//   - Before any DDL it checks the rows against the value sets the schema is about to
//     enforce, and stops with a *ViolationsError, having changed nothing, when one
//     breaks them.
//   - Every statement runs under the lock timeout. A migration whose statement gives
//     up is run again, after a backoff, from its first statement: every migration file
//     is idempotent (see the package doc, embed.go), so what it did before is skipped, and an interrupted
//     run is finished the same way by the next one. A retry first waits (15 s at most)
//     for the transactions older than the lock timeout to end, so as not to queue
//     behind the same one again. Before each run, any INVALID index left by a
//     concurrent build that gave up is dropped, since IF NOT EXISTS would otherwise
//     skip it for ever.
//   - On a database a newer release migrated (certworker_release), it changes nothing
//     and returns a *NewerError: that release's schema already holds what this one
//     needs, and this binary's functions would put old bodies back.
//   - Once every migration and function is applied, it records the release in
//     certworker_release.
func Up(ctx context.Context, db *sql.DB, opts Options) ([]Result, error) {
	opts = opts.withDefaults()
	guard, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer guard.Close()
	unlock, err := lockMigrations(ctx, guard)
	if err != nil {
		return nil, err
	}
	defer unlock()
	rel := *opts.Release
	rec, err := ReadRelease(ctx, guard)
	if err != nil {
		return nil, err
	}
	if rec != nil && newerThan(rec.Release, rel.Version) {
		return nil, &NewerError{Database: rec.Release, ServesFrom: rec.ServesFrom, Binary: rel.Version}
	}
	if err := setLockTimeout(ctx, guard, opts.LockTimeout); err != nil {
		return nil, err
	}
	if err := Preflight(ctx, guard); err != nil {
		return nil, err
	}
	if err := warnPublicCreate(ctx, guard, opts.OnNotice); err != nil {
		return nil, err
	}
	var out []Result
	for attempt := 1; ; attempt++ {
		applied, err := runOnce(ctx, db, guard, opts)
		out = append(out, applied...)
		if err == nil {
			return out, recordRelease(ctx, guard, rel)
		}
		if isCheckViolation(err) {
			// A row written between the preflight and the constraint (which checks
			// every write from the moment it exists) breaks its validation: say which,
			// as the preflight would have.
			if verr := Preflight(ctx, guard); verr != nil {
				return out, verr
			}
		}
		if !gaveUpWaiting(err) || attempt >= opts.Attempts || ctx.Err() != nil {
			return out, fmt.Errorf("apply migrations: %w", err)
		}
		wait := backoff(attempt)
		if opts.OnRetry != nil {
			opts.OnRetry(Retry{Attempt: attempt, Wait: wait, Err: err})
		}
		select {
		case <-ctx.Done():
			return out, fmt.Errorf("apply migrations: %w", ctx.Err())
		case <-time.After(wait):
		}
		if err := waitForOldTransactions(ctx, guard, opts.LockTimeout); err != nil {
			return out, err
		}
	}
}

// oldTransactionsWait bounds how long a retry waits for old transactions to end: a
// session the proxy left idle in a transaction must not stop migrate for good.
const oldTransactionsWait = 15 * time.Second

// waitForOldTransactions waits, before a retry, until no other session of this
// database has had a transaction open for longer than the lock timeout (or for
// oldTransactionsWait at most). Such a transaction is what the statement that gave up
// was waiting for, a lock it holds or a snapshot a concurrent index build must see
// end; retrying while it lasts would queue behind it again, and the proxy's writes
// with it, once per retry. Where the role may not see other roles' sessions
// (pg_stat_activity hides their xact_start), nothing is found and the retry goes
// ahead.
func waitForOldTransactions(ctx context.Context, guard *sql.Conn, lockTimeout time.Duration) error {
	deadline := time.Now().Add(oldTransactionsWait)
	for time.Now().Before(deadline) {
		var old int
		err := guard.QueryRowContext(ctx, `
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
  AND xact_start < now() - make_interval(secs => $1)`, max(lockTimeout, 0).Seconds()).Scan(&old)
		if err != nil {
			return fmt.Errorf("look for old transactions: %w", err)
		}
		if old == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("apply migrations: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// runOnce drops what an earlier attempt left half-built, then runs every pending
// migration, then the functions step. A new goose provider each time: goose remembers that it has created its
// version table even when that failed.
func runOnce(ctx context.Context, db *sql.DB, guard *sql.Conn, opts Options) ([]Result, error) {
	if err := dropInvalidIndexes(ctx, guard); err != nil {
		return nil, err
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, opts.Release.fsys(),
		goose.WithSessionLocker(sessionSettings{lockTimeout: opts.LockTimeout}))
	if err != nil {
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	results, err := provider.Up(ctx)
	var partial *goose.PartialError
	if errors.As(err, &partial) {
		results = partial.Applied
	}
	out := make([]Result, 0, len(results))
	for _, r := range results {
		out = append(out, Result{Version: r.Source.Version, Source: r.Source.Path, Duration: r.Duration.String()})
	}
	if err != nil {
		return out, err
	}
	// Then the current definition of every function (functions.go), whatever the
	// numbered migrations left.
	replaced, err := applyFunctionsOf(ctx, guard, opts.Release.fsys(), opts.OnNotice)
	return append(out, replaced...), err
}

// gaveUpWaiting reports whether err is a statement that gave up waiting for a lock
// (lock_not_available: the lock timeout) or was chosen as a deadlock's victim: both
// are worth another try once the other transaction is gone.
func gaveUpWaiting(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "40P01")
}

// isCheckViolation reports whether err is a row breaking a CHECK constraint.
func isCheckViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514"
}

// backoff is the pause after the nth failed attempt.
func backoff(attempt int) time.Duration {
	d := retryBase << min(attempt-1, 10)
	d = min(d, retryMax)
	jitter := time.Duration(rand.Int64N(int64(d)/5 + 1))
	return d - d/10 + jitter
}

// HasPending reports whether the database lacks any embedded migration.
//
// Deprecated: Check also tells a database migrated by a newer binary apart, and does
// not create goose's version table on a database that has none.
func HasPending(ctx context.Context, db *sql.DB) (bool, error) {
	provider, err := goose.NewProvider(goose.DialectPostgres, db, FS)
	if err != nil {
		return false, fmt.Errorf("load migrations: %w", err)
	}
	pending, err := provider.HasPending(ctx)
	if err != nil {
		return false, fmt.Errorf("read schema version: %w", err)
	}
	return pending, nil
}

// PublicCreateWarning is what Up says (Options.OnNotice) when PUBLIC may create
// objects in schema public.
const PublicCreateWarning = "warning: every role may CREATE in schema public (the default of a database " +
	"created before PostgreSQL 15): any role the proxy's database lets in can put functions and operators " +
	"there that other roles' statements may pick over the built-in ones (certworker's own functions " +
	"qualify what they call, and compare as text, but the proxy's statements may not); " +
	"unless something needs it, run: REVOKE CREATE ON SCHEMA public FROM PUBLIC"

// warnPublicCreate tells onNotice when PUBLIC may create in schema public (PostgreSQL
// 14 and older create every database so, and an upgrade keeps it): certworker cannot
// revoke it (the schema's rights are the operator's), but can say so at every migrate.
func warnPublicCreate(ctx context.Context, conn *sql.Conn, onNotice func(string)) error {
	var may bool
	if err := conn.QueryRowContext(ctx, `SELECT has_schema_privilege('public', 'public', 'CREATE')`).Scan(&may); err != nil {
		return fmt.Errorf("read the rights on schema public: %w", err)
	}
	if may && onNotice != nil {
		onNotice(PublicCreateWarning)
	}
	return nil
}
