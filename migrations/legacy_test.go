package migrations_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/legacydb"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/migrations"
)

// The proxy's database, created by the proxy without the CHECK constraints and
// holding years of rows, comes out of migrate with exactly the schema a fresh database
// gets (constraints validated, every index valid), and with every row as it was.
// Before this, 00001's CREATE TABLE IF NOT EXISTS skipped the existing tables whole,
// and the value sets were never enforced.
func TestUp_BringsTheProxysDatabaseToTheContractsSchema(t *testing.T) {
	t.Parallel()
	fresh := pgtest.NewDB(t)
	url := legacy(t)
	rowsBefore := rowsDigest(t, url)

	_, err := migrations.Up(context.Background(), openDB(t, url), migrations.Options{})
	require.NoError(t, err)

	require.Equal(t, schema(t, fresh), schema(t, url))
	require.Equal(t, rowsBefore, rowsDigest(t, url), "migrate changed a row")
	require.NoError(t, migrations.Check(context.Background(), openDB(t, url)))
	var nullable string
	require.NoError(t, connect(t, url).QueryRow(context.Background(), `
SELECT is_nullable FROM information_schema.columns
WHERE table_name = 'proxy_certificates' AND column_name = 'expires_at'`).Scan(&nullable))
	require.Equal(t, "YES", nullable, "expires_at must stay nullable: the reference wrote NULL")
}

// A database migrated by the old 00001 has expires_at NOT NULL: 00006 drops it, so
// that a row the reference or an operator wrote with NULL can be stored.
func TestUp_MakesExpiresAtNullableOnADatabaseTheOld00001Created(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t)
	conn := connect(t, url)
	ctx := context.Background()
	_, err := conn.Exec(ctx, `ALTER TABLE proxy_certificates ALTER COLUMN expires_at SET NOT NULL;
DELETE FROM goose_db_version WHERE version_id >= 6`)
	require.NoError(t, err)

	_, err = migrations.Up(ctx, openDB(t, url), migrations.Options{})
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem)
VALUES ('uploaded.example', 'pem', 'key')`)
	require.NoError(t, err, "a certificate without expires_at cannot be stored")
}

// A row outside the value sets stops migrate before any DDL: the message lists the
// rows by id and the statement that fixes them, and the database is as it was (not
// even goose's version table is created). After the fix, migrate goes through.
func TestUp_RefusesRowsOutsideTheValueSetsAndChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := legacy(t)
	conn := connect(t, url)
	badStatus := []string{legacydb.DomainID(1), legacydb.DomainID(2)}
	badProvider := legacydb.DomainID(3)
	_, err := conn.Exec(ctx, `
UPDATE proxy_domains SET ssl_status = CASE id WHEN $1 THEN 'Active' ELSE ' pending' END WHERE id IN ($1, $2)`,
		badStatus[0], badStatus[1])
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `UPDATE proxy_domains SET ssl_provider = 'letsencrypt' WHERE id = $1`, badProvider)
	require.NoError(t, err)
	schemaBefore, rowsBefore := lines(t, url, catalogueSQL), rowsDigest(t, url)

	_, err = migrations.Up(ctx, openDB(t, url), migrations.Options{})
	var verr *migrations.ViolationsError
	require.ErrorAs(t, err, &verr)
	require.Len(t, verr.Violations, 2)
	status, provider := verr.Violations[0], verr.Violations[1]
	require.Equal(t, "ssl_status", status.Column)
	require.Equal(t, 2, status.Count)
	require.Equal(t, []migrations.BadValue{{ID: badStatus[0], Value: "Active"}, {ID: badStatus[1], Value: " pending"}}, status.Rows)
	require.Equal(t, "ssl_provider", provider.Column)
	require.Equal(t, []migrations.BadValue{{ID: badProvider, Value: "letsencrypt"}}, provider.Rows)
	msg := err.Error()
	for _, want := range []string{badStatus[0], badStatus[1], badProvider, "nothing was changed",
		"UPDATE proxy_domains SET ssl_status = lower(btrim(ssl_status)) WHERE ssl_status NOT IN ('pending', 'provisioning', 'active', 'failed')",
		"UPDATE proxy_domains SET ssl_provider = '<one of acme, manual, none>' WHERE ssl_provider NOT IN ('acme', 'manual', 'none')"} {
		require.Contains(t, msg, want)
	}

	require.Equal(t, schemaBefore, lines(t, url, catalogueSQL), "the refused migrate changed the schema")
	require.Equal(t, rowsBefore, rowsDigest(t, url))
	var versionTable *string
	require.NoError(t, conn.QueryRow(ctx, `SELECT to_regclass('goose_db_version')::text`).Scan(&versionTable))
	require.Nil(t, versionTable, "the refused migrate created goose's version table")

	_, err = conn.Exec(ctx, `UPDATE proxy_domains SET ssl_status = lower(btrim(ssl_status)) WHERE ssl_status NOT IN ('pending', 'provisioning', 'active', 'failed');
UPDATE proxy_domains SET ssl_provider = 'acme' WHERE ssl_provider NOT IN ('acme', 'manual', 'none')`)
	require.NoError(t, err)
	_, err = migrations.Up(ctx, openDB(t, url), migrations.Options{})
	require.NoError(t, err)
}

// Four instances migrating the same database at once (a deploy that starts them
// together): every one succeeds, each migration is applied once, and the schema is
// the contract's. Without the lock, two would run 00001 at once and one would fail on
// the other's half-built index.
func TestUp_SeveralInstancesAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := legacy(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	applied := make([][]migrations.Result, 4)
	for i := range errs {
		wg.Go(func() {
			applied[i], errs[i] = migrations.Up(ctx, openDB(t, url), migrations.Options{})
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	// Numbered migrations (Version > 0) are counted against goose's table; a function
	// file (Version 0), replaced where it differs from what the numbered ones left, is
	// applied by one instance too.
	total := 0
	functions := map[string]int{}
	for _, rs := range applied {
		for _, r := range rs {
			if r.Version > 0 {
				total++
			} else {
				functions[r.Source]++
			}
		}
	}
	for f, n := range functions {
		require.Equal(t, 1, n, "%s was applied by %d instances", f, n)
	}
	versions := lines(t, url, `SELECT version_id::text FROM goose_db_version WHERE version_id > 0 ORDER BY id`)
	require.Len(t, versions, total, "every migration is applied by exactly one instance")
	require.Equal(t, schema(t, pgtest.NewDB(t)), schema(t, url))
}

// A second migrate finds nothing to do and touches nothing: no statement, not even
// one that would leave the same definition behind (that would take a lock on the
// proxy's tables at every deploy).
func TestUp_ASecondRunChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := legacy(t)
	_, err := migrations.Up(ctx, openDB(t, url), migrations.Options{})
	require.NoError(t, err)
	catalogue, rows := lines(t, url, catalogueSQL), rowsDigest(t, url)

	results, err := migrations.Up(ctx, openDB(t, url), migrations.Options{})
	require.NoError(t, err)
	require.Empty(t, results)
	require.Equal(t, catalogue, lines(t, url, catalogueSQL))
	require.Equal(t, rows, rowsDigest(t, url))
}

// A migrate interrupted half way (here: a concurrent index build that gave up, with no
// retry left, while a transaction of the proxy's kept an old snapshot) leaves an
// INVALID index behind. The next run drops it and builds it again: IF NOT EXISTS alone
// would skip it for ever, leaving an index maintained on every write and never used.
func TestUp_AnInterruptedRunIsFinishedByTheNext(t *testing.T) {
	t.Parallel()
	url := legacy(t)
	snapshot := holdSnapshot(t, url)

	_, err := upWatched(t, url, migrations.Options{LockTimeout: 200 * time.Millisecond, Attempts: 1})
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "55P03", pgErr.Code, "the build should have given up waiting: %v", err)
	invalid := lines(t, url, `SELECT indexrelid::regclass::text FROM pg_index WHERE NOT indisvalid`)
	require.NotEmpty(t, invalid, "the interrupted build left no INVALID index: the test proves nothing")

	snapshot.release()
	_, err = upWatched(t, url, migrations.Options{})
	require.NoError(t, err)
	require.Empty(t, lines(t, url, `SELECT indexrelid::regclass::text FROM pg_index WHERE NOT indisvalid`))
	require.Equal(t, schema(t, pgtest.NewDB(t)), schema(t, url))
}

// A statement that gives up waiting is retried, with backoff, once the transaction it
// waited for has ended: the retry waits for transactions older than the lock timeout
// rather than queueing behind the same one again (and the proxy's writes with it),
// where a plain backoff (250 ms, 500 ms, ...) would give up again and again while the
// transaction lasts: no retry comes while it is open. (Not "one retry": on a loaded
// machine a statement of the retry gave up again, on its 100 ms, behind another
// session's short transaction, after the old one had ended.)
func TestUp_RetriesOnceTheOldTransactionHasEnded(t *testing.T) {
	t.Parallel()
	url := legacy(t)
	snapshot := holdSnapshot(t, url)
	type retry struct {
		migrations.Retry
		at time.Time
	}
	var mu sync.Mutex
	var retries []retry
	onRetry := func(r migrations.Retry) {
		mu.Lock()
		defer mu.Unlock()
		retries = append(retries, retry{Retry: r, at: time.Now()})
		time.AfterFunc(time.Second, snapshot.release)
	}

	_, err := upWatched(t, url, migrations.Options{LockTimeout: 100 * time.Millisecond, OnRetry: onRetry})
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, retries, "no retry: the old transaction held nothing up, the test proves nothing")
	released := snapshot.releasedAt()
	require.False(t, released.IsZero(), "the old transaction was not ended")
	for _, r := range retries[1:] {
		require.True(t, r.at.After(released), "retry %d gave up at %s, while the old transaction was still open (ended %s): %v",
			r.Attempt, r.at.Format("15:04:05.000"), released.Format("15:04:05.000"), r.Err)
	}
	r := retries[0]
	require.Equal(t, 1, r.Attempt)
	require.Positive(t, r.Wait)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(r.Err, &pgErr) && pgErr.Code == "55P03", "retried %v", r.Err)
	require.Equal(t, schema(t, pgtest.NewDB(t)), schema(t, url))
}

// heldSnapshot is a transaction of the proxy's that holds an old snapshot, without a
// lock on any of its tables: a concurrent index build waits for it to end.
type heldSnapshot struct {
	once    sync.Once
	release func()
	// ended is when its COMMIT returned, once released.
	mu    sync.Mutex
	ended time.Time
}

func (h *heldSnapshot) releasedAt() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ended
}

func holdSnapshot(t *testing.T, url string) *heldSnapshot {
	t.Helper()
	ctx := context.Background()
	conn := connect(t, url)
	_, err := conn.Exec(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)
	h := &heldSnapshot{}
	h.release = func() {
		h.once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			_, _ = conn.Exec(ctx, `COMMIT`)
			h.ended = time.Now()
		})
	}
	t.Cleanup(h.release)
	return h
}

// The preflight's list of value sets is the schema's: a set the schema enforces and
// the preflight does not check would let a bad row through to the constraint's
// validation, which fails without saying which rows or how to fix them.
func TestPreflight_KnowsEveryValueSetTheSchemaEnforces(t *testing.T) {
	t.Parallel()
	defs := lines(t, pgtest.NewDB(t), `
SELECT conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint
WHERE conrelid = 'proxy_domains'::regclass AND contype = 'c' ORDER BY conname`)
	want := migrations.ValueSetsForTest()
	require.Len(t, defs, len(want))
	for _, def := range defs {
		name, _, _ := strings.Cut(def, " ")
		allowed, ok := want[name]
		require.True(t, ok, "the preflight does not check %s", def)
		require.Equal(t, len(allowed), strings.Count(def, "'::text"), def)
		for _, v := range allowed {
			require.Contains(t, def, "'"+v+"'::text", def)
		}
	}
}
