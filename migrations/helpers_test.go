package migrations_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/legacydb"
	"github.com/certworker/certworker/internal/pgtest"
)

func TestMain(m *testing.M) {
	// No autovacuum on the package's server. These tests run migrate under lock
	// timeouts of 100-200 ms, and a concurrent index build (even CREATE INDEX
	// CONCURRENTLY IF NOT EXISTS of an index that exists) waits for the lock an
	// autovacuum holds, which the legacy fixture's updates and the migrations' own
	// backfills start. PostgreSQL ends such an autovacuum only after deadlock_timeout
	// (1 s), longer than those timeouts (migrate's default, 2 s, is not): seen failing
	// two tests beside a CPU hog. The tests are about the proxy's locks.
	pgtest.Settings = append(pgtest.Settings, "autovacuum=off")
	pgtest.Main(m)
}

// legacy is a fresh copy of the proxy's database as the reference left it, never
// migrated: 10,000 domains of 100 tenants in every state. That is ten batches of each
// of migrate's backfills (1,000 rows a batch), which is what these tests need of the
// size; at the fixture's default of 100,000, the package's eleven migrations of a
// copy took five minutes of the server's time. BenchmarkUp_UnderProxyWrites
// (online_bench_test.go) measures migrate at 100,000.
func legacy(t *testing.T) string {
	t.Helper()
	return legacydb.New(t, pgtest.Shared(t), legacydb.Options{Domains: 10_000, Tenants: 100})
}

// openDB is a database/sql handle on url, closed when the test ends.
func openDB(t testing.TB, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// schemaSQL describes everything a migration creates, one line per object, in an
// order that does not depend on the order it was created in: two databases with the
// same lines have the same schema.
const schemaSQL = `
SELECT 'column ' || table_name || '.' || column_name || ' ' || data_type
       || ' nullable=' || is_nullable || ' default=' || COALESCE(column_default, '')
FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name <> 'goose_db_version'
UNION ALL
SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
       || ' validated=' || convalidated
FROM pg_constraint WHERE connamespace = current_schema()::regnamespace
  AND conrelid::regclass::text <> 'goose_db_version'
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid) || ' valid=' || i.indisvalid
FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
WHERE c.relnamespace = current_schema()::regnamespace AND c.relname <> 'goose_db_version'
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(t.oid) || ' enabled=' || t.tgenabled::text
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE NOT t.tgisinternal AND c.relnamespace = current_schema()::regnamespace
UNION ALL
SELECT 'function ' || pg_get_functiondef(p.oid)
FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace
UNION ALL
SELECT 'publication ' || pubname || ' ' || tablename FROM pg_publication_tables
UNION ALL
SELECT 'grant ' || table_name || ' ' || grantee || ' ' || privilege_type
FROM information_schema.role_table_grants
WHERE table_schema = current_schema() AND grantee = 'PUBLIC'
ORDER BY 1`

// catalogueSQL adds to schemaSQL what changes when a statement touches an object
// without changing its definition: the object's identity (oid, file) and the
// transaction that last wrote its catalogue row. A run of migrate that took any lock
// to change anything, even to the same definition, changes one of them.
const catalogueSQL = `
SELECT 'relation ' || c.relname || ' oid=' || c.oid || ' file=' || c.relfilenode || ' xmin=' || c.xmin
FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace AND c.relname <> 'goose_db_version'
UNION ALL
SELECT 'constraint ' || conname || ' oid=' || oid || ' xmin=' || xmin
FROM pg_constraint WHERE connamespace = current_schema()::regnamespace
UNION ALL
SELECT 'trigger ' || tgname || ' oid=' || oid || ' xmin=' || xmin FROM pg_trigger WHERE NOT tgisinternal
UNION ALL
SELECT 'function ' || proname || ' oid=' || oid || ' xmin=' || xmin
FROM pg_proc WHERE pronamespace = current_schema()::regnamespace
ORDER BY 1`

func lines(t *testing.T, url, query string) []string {
	t.Helper()
	conn := connect(t, url)
	rows, err := conn.Query(context.Background(), query)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

func schema(t *testing.T, url string) []string {
	t.Helper()
	return lines(t, url, schemaSQL)
}

// rowsDigest is a digest of every row of the proxy's three tables, in their
// reference columns: a migration must not change a row.
func rowsDigest(t *testing.T, url string) string {
	t.Helper()
	return strings.Join(lines(t, url, `
SELECT 'tenants ' || count(*) || ' ' || md5(string_agg(t::text, '|' ORDER BY id)) FROM proxy_tenants t
UNION ALL
SELECT 'domains ' || count(*) || ' ' || md5(string_agg(
    concat_ws(',', id, tenant_id, domain, verification_status, verification_method, verification_token,
              ssl_status, ssl_provider, ssl_attempts, ssl_last_attempt_at, ssl_error, ssl_expires_at,
              created_at, updated_at), '|' ORDER BY id))
FROM proxy_domains
UNION ALL
SELECT 'certificates ' || count(*) || ' ' || md5(string_agg(
    concat_ws(',', id, domain, certificate_pem, private_key_pem, expires_at, auto_renew,
              created_at, updated_at), '|' ORDER BY id))
FROM proxy_certificates`), "\n")
}
