package migrations_test

import (
	"context"
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

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
