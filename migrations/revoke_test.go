package migrations_test

import (
	"context"
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/migrations"
)

// 00005 and 00007 create SECURITY DEFINER functions: each is revoked from PUBLIC in
// the step that creates it, so that no moment of a fresh install (the migrations are
// NO TRANSACTION: each statement commits on its own) lets any role run one with the
// owner's rights. Guards against the window of old, from 00005 until 00009 committed.
func TestMigrations_DefinerFunctionsAreNeverExecutableByPublic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := legacy(t)
	db := openDB(t, url)
	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS)
	require.NoError(t, err)
	for _, step := range []struct {
		version   int64
		functions []string
	}{
		{5, []string{"certworker_enqueue(uuid)", "certworker_queued()"}},
		{7, []string{"certworker_certificate_changed()"}},
	} {
		_, err := provider.UpTo(ctx, step.version)
		require.NoError(t, err)
		for _, f := range step.functions {
			var public bool
			require.NoError(t, db.QueryRowContext(ctx, `SELECT has_function_privilege('public', $1, 'EXECUTE')`, f).Scan(&public))
			require.False(t, public, "after migration %d, PUBLIC may execute the definer function %s", step.version, f)
		}
	}
}

// certworker_enqueue, a definer function nothing has called since 00015, is gone from
// a migrated database, and going back down through 00015 (whose wake trigger called
// it) still works: 00019's Down creates it again. Guards against a definer function
// left in the proxy's database for nothing, and against a Down that a drop broke.
func TestMigrations_EnqueueIsDroppedAndDownStillWorks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDB(t)
	db := openDB(t, url)
	var exists bool
	require.NoError(t, db.QueryRowContext(ctx, `SELECT to_regprocedure('public.certworker_enqueue(uuid)') IS NOT NULL`).Scan(&exists))
	require.False(t, exists, "certworker_enqueue is still in the database")

	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS)
	require.NoError(t, err)
	_, err = provider.DownTo(ctx, 14)
	require.NoError(t, err, "down through 00015")
	require.NoError(t, db.QueryRowContext(ctx, `SELECT to_regprocedure('public.certworker_enqueue(uuid)') IS NOT NULL`).Scan(&exists))
	require.True(t, exists, "below 00015 the wake trigger needs certworker_enqueue")
	_, err = db.ExecContext(ctx, `
WITH t AS (INSERT INTO proxy_tenants (name, slug, email) VALUES ('t', 't', 't@example.com') RETURNING id)
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
SELECT id, 'down.example', 'verified', 'tok', 'pending', 'acme' FROM t`)
	require.NoError(t, err, "the wake trigger of 00014 fires")
}

// migrate says, at every run, when PUBLIC may create objects in schema public (every
// database created before PostgreSQL 15, and each upgraded since): the rights are the
// operator's to revoke, and the operator has to hear of it. Guards against a database
// where any role can plant an operator the proxy's statements pick, silently.
func TestMigrate_WarnsWhenPublicMayCreateInSchemaPublic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDB(t)
	db := openDB(t, url)
	up := func() []string {
		var notices []string
		_, err := migrations.Up(ctx, db, migrations.Options{OnNotice: func(s string) { notices = append(notices, s) }})
		require.NoError(t, err)
		return notices
	}
	require.NotContains(t, up(), migrations.PublicCreateWarning, "warned with CREATE revoked (PostgreSQL 15's default)")
	_, err := db.ExecContext(ctx, `GRANT CREATE ON SCHEMA public TO PUBLIC`)
	require.NoError(t, err)
	require.Contains(t, up(), migrations.PublicCreateWarning)
}
