package main

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker"
	"github.com/certworker/certworker/internal/legacydb"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/releasetest"
	"github.com/certworker/certworker/migrations"
)

func execSQL(t *testing.T, dsn, sql string, args ...any) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql, args...)
	require.NoError(t, err)
}

// `run` refuses a database whose schema it cannot run on, with exit 2 and what to
// do: behind it, run its release's migrate; past its window (a release two ahead
// migrated it), run that release; ahead of it with no record of a release that
// serves it, do not run this binary, rather than work with rules it does not know.
// The same for the functions in the database (migrations/functions): applied by an
// older binary's migrate, or by a newer one's that does not say it serves this one.
func TestCLI_RunRefusesASchemaBehindOrPastTheWindow(t *testing.T) {
	t.Parallel()
	behind := pgtest.NewDB(t)
	execSQL(t, behind, `DELETE FROM goose_db_version WHERE version_id = 6`)
	ahead := pgtest.NewDB(t)
	execSQL(t, ahead, `INSERT INTO goose_db_version (version_id, is_applied) VALUES (900, true)`)
	olderFunctions := pgtest.NewDB(t)
	execSQL(t, olderFunctions, `UPDATE certworker_functions SET sha256 = 'older', generation = 0 WHERE name = 'certworker_queued'`)
	newerFunctions := pgtest.NewDB(t)
	execSQL(t, newerFunctions, `UPDATE certworker_functions SET generation = generation + 1`)
	// Two releases ahead: its schema serves the next release and later, not this one.
	next := releasetest.NextVersion(certworker.Version())
	later := releasetest.NextVersion(next)
	pastWindow := pgtest.NewDB(t)
	execSQL(t, pastWindow, `UPDATE certworker_release SET release = $1, serves_from = $2`, later, next)
	for _, tc := range []struct {
		dsn, want string
	}{
		{behind, "run `certworker migrate` of release " + certworker.Version() + " first"},
		{pastWindow, "which serves releases " + next + " and newer (this binary is release " + certworker.Version() + "): run certworker " + later + ", or " + next},
		{ahead, "ahead of this binary (a newer certworker applied migration 00900"},
		{olderFunctions, "function certworker_queued in the database is not the one this binary was built with"},
		{newerFunctions, "the database's functions are ahead of this binary"},
	} {
		code, _, stderr := invoke(t, "run", "--database-url", tc.dsn, "--http01-listen", "", "--admin-listen", "")
		require.Equal(t, exitUsage, code, stderr)
		require.Contains(t, stderr, tc.want)
	}
}

func TestCLI_MigrateLockTimeout(t *testing.T) {
	t.Setenv("CERTWORKER_DATABASE_URL", "postgres://x:y@127.0.0.1:1/none")
	for _, args := range [][]string{
		{"migrate", "--lock-timeout", "0s"},
		{"migrate", "--lock-timeout", "-1s"},
		{"migrate", "--lock-timeout", "soon"},
	} {
		code, _, stderr := invoke(t, args...)
		require.Equal(t, exitUsage, code, "%v: %s", args, stderr)
		require.Contains(t, stderr, "--lock-timeout", "%v", args)
	}
	t.Setenv("CERTWORKER_LOCK_TIMEOUT", "soon")
	code, _, stderr := invoke(t, "migrate")
	require.Equal(t, exitUsage, code, stderr)
	require.Contains(t, stderr, "lock-timeout")
}

// migrate on the proxy's database: a row outside the value sets makes it exit 1 with
// the rows and the fix, in one line; once fixed, it migrates, and `run` accepts the
// database. A statement that gave up waiting for a lock is reported on stderr as it
// is retried.
func TestCLI_MigrateTheProxysDatabase(t *testing.T) {
	t.Parallel()
	dsn := legacydb.New(t, pgtest.Shared(t), legacydb.Options{Domains: 2_000, Tenants: 20})
	execSQL(t, dsn, `UPDATE proxy_domains SET ssl_status = 'Active' WHERE id = $1`, legacydb.DomainID(7))
	code, stdout, stderr := invoke(t, "migrate", "--database-url", dsn)
	require.Equal(t, exitFailed, code, stderr)
	require.Empty(t, stdout)
	require.Equal(t, 1, strings.Count(strings.TrimSpace(stderr), "\n")+1, "not one line: %q", stderr)
	require.Contains(t, stderr, legacydb.DomainID(7))
	require.Contains(t, stderr, "UPDATE proxy_domains SET ssl_status = lower(btrim(ssl_status))")

	execSQL(t, dsn, `UPDATE proxy_domains SET ssl_status = lower(ssl_status)`)
	ctx := context.Background()
	proxy, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer proxy.Close(ctx)
	// A transaction of the proxy's that keeps an old snapshot for a while: the first
	// concurrent index build waits for it, gives up after the lock timeout, and is
	// retried. It ends a second after the build is seen waiting for it (more than
	// the 300 ms lock timeout), not at a fixed time: on a loaded machine migrate took
	// longer than a second to reach the build, and never waited.
	_, err = proxy.Exec(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ`)
	require.NoError(t, err)
	_, err = proxy.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)
	released := make(chan struct{})
	go func() {
		defer close(released)
		defer func() { _, _ = proxy.Exec(ctx, `COMMIT`) }()
		watch, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return
		}
		defer watch.Close(ctx)
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			var waiting bool
			if watch.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
WHERE pid <> pg_backend_pid() AND query ILIKE '%CREATE INDEX CONCURRENTLY%' AND wait_event_type = 'Lock')`).Scan(&waiting) != nil || waiting {
				time.Sleep(time.Second)
				return
			}
		}
	}()
	defer func() { <-released }()

	code, stdout, stderr = invoke(t, "migrate", "--database-url", dsn, "--lock-timeout", "300ms")
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "applied 00006_live_database.sql")
	require.Contains(t, stderr, "gave up waiting for a lock after 300ms")
	require.Contains(t, stderr, "retrying in")

	code, stdout, _ = invoke(t, "migrate", "--database-url", dsn)
	require.Equal(t, exitOK, code)
	require.Contains(t, stdout, "up to date")
}

// migrate of this release on a database the next release migrated changes nothing,
// says so, and exits 0: a rollback, or this release's Job applied again, is not a
// failure. Past this release's window it says which release's migrate to run.
func TestCLI_MigrateOfAnOlderReleaseChangesNothing(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	db, next := migrateToNext(t, dsn)

	code, stdout, stderr := invoke(t, "migrate", "--database-url", dsn)
	require.Equal(t, exitOK, code, stderr)
	require.Equal(t, "the database schema is of release "+next.Version+", newer than this binary's "+certworker.Version()+", which it still serves: nothing changed\n", stdout)
	var place string
	require.NoError(t, db.QueryRow(`SELECT prosrc FROM pg_proc WHERE proname = 'certworker_queue_place'`).Scan(&place))
	require.Contains(t, place, releasetest.Column, "the next release's body was put back")

	execSQL(t, dsn, `UPDATE certworker_release SET serves_from = release`)
	code, stdout, stderr = invoke(t, "migrate", "--database-url", dsn)
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "nothing changed; run `certworker migrate` of release "+next.Version+" or newer")
}

// `run` starts on the schema the next release's migrate left (a new column, a new
// trigger on proxy_domains, a new body of a function its claim calls), says so, and
// issues from Pebble under the workers' least-privilege role: the old instances of a
// rolling deploy keep working and restarting after the new release's migrate, and a
// rollback needs nothing in the database. Guards against a schema check that refuses
// the next release's schema, as one did that required the binary's exact migrations.
func TestRun_IssuesOnTheNextReleasesSchema(t *testing.T) {
	t.Parallel()
	bin := buildCertworker(t)
	adminDSN := pgtest.NewDB(t)
	db, next := migrateToNext(t, adminDSN)
	logs := issueThroughBinary(t, bin, adminDSN, leastPrivilegeRole(t, adminDSN), "notify")
	require.Contains(t, logs, `"msg":"the database schema was migrated by another release, which serves this one","release":"`+certworker.Version()+`","schema_release":"`+next.Version+`"`)
	var seen string
	require.NoError(t, db.QueryRow(`SELECT `+releasetest.Column+` FROM proxy_domains WHERE ssl_status = 'active'`).Scan(&seen))
	require.Equal(t, "provisioning,active", seen, "the next release's trigger did not see run's writes")
}

// migrateToNext migrates dsn to a synthetic next release (internal/releasetest) and
// returns a handle on it, closed when the test ends, and the release.
func migrateToNext(t *testing.T, dsn string) (*sql.DB, migrations.Release) {
	t.Helper()
	next := releasetest.Next(t)
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	_, err = migrations.Up(context.Background(), db, migrations.Options{Release: &next})
	require.NoError(t, err)
	return db, next
}
