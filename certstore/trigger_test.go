package certstore_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/certstore"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/migrations"
)

// channelReader is a connection listening on certstore.Channel.
type channelReader struct {
	t    *testing.T
	conn *pgx.Conn
	db   *pgx.Conn // writes the sentinels
}

func listenChannel(t *testing.T, dsn string) *channelReader {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(ctx) })
	_, err = conn.Exec(ctx, "LISTEN "+certstore.Channel)
	require.NoError(t, err)
	db, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close(ctx) })
	return &channelReader{t: t, conn: conn, db: db}
}

// next is the payload of the next notification, waited for at most 5 s.
func (r *channelReader) next() string {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := r.conn.WaitForNotification(ctx)
	require.NoError(r.t, err, "no notification within 5 s")
	return n.Payload
}

// nothingBefore checks that the next notification is a sentinel sent now: whatever
// the statements before it did, they notified nothing (no sleep needed: PostgreSQL
// delivers notifications in commit order).
func (r *channelReader) nothingBefore() {
	r.t.Helper()
	_, err := r.db.Exec(context.Background(), `SELECT pg_notify($1, 'sentinel')`, certstore.Channel)
	require.NoError(r.t, err)
	require.Equal(r.t, "sentinel", r.next(), "a notification came that should not have")
}

func (b *bundle) version(t *testing.T, name string) int64 {
	t.Helper()
	var v *int64
	require.NoError(t, b.admin.QueryRow(b.ctx, `SELECT version FROM proxy_certificates WHERE domain = $1`, name).Scan(&v))
	require.NotNil(t, v, "a row written since migration 00007 has a version")
	return *v
}

// The certificate trigger notifies, with the name in lower case, in the transaction
// that inserts, replaces, renames or deletes a row, and only if it commits; the
// worker's bookkeeping updates notify nothing. Every write draws a larger version,
// also across a delete and a new insert. Guards against a proxy missing a
// certificate, and against renewal scheduling flooding every proxy with reloads.
func TestTrigger_NotifiesCertificateChangesWithAVersion(t *testing.T) {
	t.Parallel()
	b := setup(t, certstore.Options{})
	r := listenChannel(t, b.dsn)
	c := b.ca.valid(t, "shop.example")

	b.storeCert(t, b.admin, "Shop.Example", c)
	require.Equal(t, "shop.example", r.next())
	v1 := b.version(t, "Shop.Example")

	_, err := b.admin.Exec(b.ctx, `UPDATE proxy_certificates SET renew_at = now(), ari_next_at = now(), auto_renew = false WHERE domain = 'Shop.Example'`)
	require.NoError(t, err)
	r.nothingBefore()
	require.Equal(t, v1, b.version(t, "Shop.Example"), "bookkeeping does not move the version")

	b.storeCert(t, b.admin, "Shop.Example", b.ca.valid(t, "shop.example"))
	require.Equal(t, "shop.example", r.next())
	v2 := b.version(t, "Shop.Example")
	require.Greater(t, v2, v1)

	tx, err := b.admin.Begin(b.ctx)
	require.NoError(t, err)
	b.storeCert(t, tx, "Shop.Example", b.ca.valid(t, "shop.example"))
	require.NoError(t, tx.Rollback(b.ctx))
	r.nothingBefore()
	require.Equal(t, v2, b.version(t, "Shop.Example"))

	_, err = b.admin.Exec(b.ctx, `UPDATE proxy_certificates SET domain = 'renamed.example' WHERE domain = 'Shop.Example'`)
	require.NoError(t, err)
	got := []string{r.next(), r.next()}
	require.ElementsMatch(t, []string{"renamed.example", "shop.example"}, got, "a rename notifies both names")

	_, err = b.admin.Exec(b.ctx, `DELETE FROM proxy_certificates WHERE domain = 'renamed.example'`)
	require.NoError(t, err)
	require.Equal(t, "renamed.example", r.next())

	b.storeCert(t, b.admin, "renamed.example", b.ca.valid(t, "renamed.example"))
	require.Equal(t, "renamed.example", r.next())
	require.Greater(t, b.version(t, "renamed.example"), v2, "a new row is newer than the deleted one")
}

// The domain trigger notifies when a verified domain stops being verified, is
// renamed or deleted, and not when a domain is verified (which would put NOTIFY's
// commit lock on every "verify"). Guards against serving a withdrawn domain, and
// against undoing what --wake logical saves the proxy.
func TestTrigger_NotifiesWithdrawnDomainsOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, certstore.Options{})
	r := listenChannel(t, b.dsn)
	b.domain(t, "a.example", "pending", "acme", "pending")
	b.domain(t, "B.example", "verified", "manual", "active")
	b.domain(t, "c.example", "verified", "acme", "active")
	r.nothingBefore()

	_, err := b.admin.Exec(b.ctx, `UPDATE proxy_domains SET verification_status = 'verified' WHERE domain = 'a.example'`)
	require.NoError(t, err)
	_, err = b.admin.Exec(b.ctx, `UPDATE proxy_domains SET ssl_status = 'pending', ssl_error = 'x', updated_at = now() WHERE domain = 'c.example'`)
	require.NoError(t, err)
	r.nothingBefore()

	_, err = b.admin.Exec(b.ctx, `UPDATE proxy_domains SET verification_status = 'failed' WHERE domain = 'a.example'`)
	require.NoError(t, err)
	require.Equal(t, "a.example", r.next())
	_, err = b.admin.Exec(b.ctx, `DELETE FROM proxy_domains WHERE domain = 'B.example'`)
	require.NoError(t, err)
	require.Equal(t, "b.example", r.next())
	_, err = b.admin.Exec(b.ctx, `UPDATE proxy_domains SET domain = 'd.example' WHERE domain = 'c.example'`)
	require.NoError(t, err)
	require.Equal(t, "c.example", r.next())
}

// The proxy's role writes certificates with no right on the version's sequence: the
// trigger runs as its owner. Guards against migration 00007 breaking the proxy's
// manual uploads with "permission denied for sequence".
func TestTrigger_ProxyRoleNeedsNoRightOnTheSequence(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	role := "proxy_" + hex.EncodeToString(suffix[:])
	_, err = conn.Exec(ctx, `CREATE ROLE `+role+` NOLOGIN;
GRANT SELECT, INSERT, UPDATE, DELETE ON proxy_certificates, proxy_domains TO `+role)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), `RESET ROLE; DROP OWNED BY `+role+`; DROP ROLE `+role)
		conn.Close(context.Background())
	})
	_, err = conn.Exec(ctx, `SET ROLE `+role)
	require.NoError(t, err)
	var version int64
	require.NoError(t, conn.QueryRow(ctx, `
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at)
VALUES ('manual.example', 'pem', 'key', now() + interval '1 day') RETURNING version`).Scan(&version))
	require.Positive(t, version)
	_, err = conn.Exec(ctx, `UPDATE proxy_certificates SET certificate_pem = 'pem2' WHERE domain = 'manual.example'`)
	require.NoError(t, err)
}

// Migration 00007 run again over itself (what the next `certworker migrate` does
// after one interrupted half-way) succeeds and leaves one working set of triggers.
// Guards against a statement that is not idempotent wedging every later migrate.
func TestMigration00007_RunsTwice(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	ctx := context.Background()
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer db.Close()
	_, err = db.ExecContext(ctx, `DELETE FROM goose_db_version WHERE version_id >= 7`)
	require.NoError(t, err)
	results, err := migrations.ApplyDB(ctx, db)
	require.NoError(t, err)
	require.NotEmpty(t, results)
	require.Equal(t, int64(7), results[0].Version)

	var triggers int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM pg_trigger
WHERE tgname IN ('certworker_certificate_insert', 'certworker_certificate_update', 'certworker_certificate_delete',
                 'certworker_domain_withdrawn_update', 'certworker_domain_withdrawn_delete')`).Scan(&triggers))
	require.Equal(t, 5, triggers)
	r := listenChannel(t, dsn)
	_, err = db.ExecContext(ctx, `INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at)
VALUES ('Again.example', 'pem', 'key', now())`)
	require.NoError(t, err)
	require.Equal(t, "again.example", r.next())
}
