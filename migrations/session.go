package migrations

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"sync"
	"time"

	"github.com/pressly/goose/v3/lock"
)

// lockPoll is how often a migrate waiting for another instance's run tries the lock.
const lockPoll = 200 * time.Millisecond

// lockMigrations takes the session advisory lock that makes one migrate run at a time,
// on guard, and returns its release. goose's own lock id, so that a migrate of an
// older certworker, which takes goose's lock, and this one exclude each other. It
// waits for as long as another instance's run lasts (or until ctx ends), by trying
// the lock every lockPoll rather than blocking in pg_advisory_lock: a statement
// blocked there keeps a snapshot open, and the other instance's CREATE INDEX
// CONCURRENTLY waits for every open snapshot to end, so the two would wait for each
// other until the lock timeout.
func lockMigrations(ctx context.Context, guard *sql.Conn) (release func(), err error) {
	for {
		var locked bool
		if err := guard.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, lock.DefaultLockID).Scan(&locked); err != nil {
			return nil, fmt.Errorf("take the migration lock: %w", err)
		}
		if locked {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for another migrate to finish: %w", ctx.Err())
		case <-time.After(lockPoll):
		}
	}
	return func() {
		ctx := context.WithoutCancel(ctx)
		// The connection goes back to the caller's pool: leave it as it came.
		_, _ = guard.ExecContext(ctx, `RESET lock_timeout`)
		_, _ = guard.ExecContext(ctx, `SELECT pg_advisory_unlock($1)`, lock.DefaultLockID)
	}, nil
}

// setLockTimeout sets the session's lock_timeout; NoLockTimeout turns it off.
func setLockTimeout(ctx context.Context, conn *sql.Conn, d time.Duration) error {
	ms := max(d.Milliseconds(), 1)
	if d < 0 {
		ms = 0
	}
	if _, err := conn.ExecContext(ctx, fmt.Sprintf(`SET lock_timeout = %d`, ms)); err != nil {
		return fmt.Errorf("set lock_timeout: %w", err)
	}
	return nil
}

// sessionSettings is the hook that reaches the connection goose runs every statement
// on: goose hands its session locker that connection before the first statement and
// after the last. It takes no lock (Up holds the advisory lock already, on its own
// connection); it sets the lock timeout, and resets it before the connection goes
// back to the pool.
type sessionSettings struct {
	lockTimeout time.Duration
}

var _ lock.SessionLocker = sessionSettings{}

func (s sessionSettings) SessionLock(ctx context.Context, conn *sql.Conn) error {
	return setLockTimeout(ctx, conn, s.lockTimeout)
}

func (s sessionSettings) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, `RESET lock_timeout`); err != nil {
		return fmt.Errorf("reset lock_timeout: %w", err)
	}
	return nil
}

// concurrentIndex finds the indexes the migrations build concurrently.
var concurrentIndex = regexp.MustCompile(`(?i)CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+([a-z_][a-z0-9_]*)`)

// ownIndexes are the names of every index the migrations build concurrently: the only
// INVALID indexes Up may drop. An INVALID index of anyone else's (the proxy's own
// migration building one right now) is left alone.
var ownIndexes = sync.OnceValues(func() ([]string, error) {
	files, err := fs.Glob(FS, "*.sql")
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, f := range files {
		b, err := fs.ReadFile(FS, f)
		if err != nil {
			return nil, err
		}
		for _, m := range concurrentIndex.FindAllStringSubmatch(string(b), -1) {
			seen[m[1]] = true
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
})

// dropInvalidIndexes drops the INVALID indexes a concurrent build of ours left behind
// when it gave up (its lock timeout, a cancelled migrate). CREATE INDEX CONCURRENTLY
// IF NOT EXISTS would find the name taken and skip it, leaving an index that is
// maintained on every write and never used. Called under the migration lock, so no
// build of ours is in progress.
func dropInvalidIndexes(ctx context.Context, guard *sql.Conn) error {
	names, err := ownIndexes()
	if err != nil {
		return fmt.Errorf("list the migrations' indexes: %w", err)
	}
	rows, err := guard.QueryContext(ctx, `
SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname)
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE NOT i.indisvalid AND c.relname = ANY($1) AND n.nspname = ANY (current_schemas(false))`, names)
	if err != nil {
		return fmt.Errorf("find invalid indexes: %w", err)
	}
	var invalid []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return fmt.Errorf("find invalid indexes: %w", err)
		}
		invalid = append(invalid, name)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("find invalid indexes: %w", err)
	}
	for _, name := range invalid {
		if _, err := guard.ExecContext(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+name); err != nil {
			return fmt.Errorf("drop invalid index %s: %w", name, err)
		}
	}
	return nil
}
