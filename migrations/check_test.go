package migrations_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/migrations"
)

func TestCheck_AMigratedDatabaseMatches(t *testing.T) {
	t.Parallel()
	require.NoError(t, migrations.Check(context.Background(), openDB(t, pgtest.NewDB(t))))
}

// `run` on the proxy's database before anyone ran migrate: behind, and Check has not
// created goose's table on it (only migrate changes a database).
func TestCheck_ANeverMigratedDatabaseIsBehind(t *testing.T) {
	t.Parallel()
	url := legacy(t)
	err := migrations.Check(context.Background(), openDB(t, url))
	var behind *migrations.BehindError
	require.ErrorAs(t, err, &behind)
	require.Zero(t, behind.Version)
	require.Equal(t, []int64{1, 2, 3, 4, 5, 6}, behind.Missing[:6])
	require.Contains(t, err.Error(), "run `certworker migrate` of release "+certworker.Version()+" first")
	require.Equal(t, []string{""}, lines(t, url, `SELECT COALESCE(to_regclass('goose_db_version')::text, '')`))
}

func TestCheck_ADatabaseMissingTheNewestMigrationIsBehind(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t)
	_, err := connect(t, url).Exec(context.Background(), `DELETE FROM goose_db_version WHERE version_id = 6`)
	require.NoError(t, err)
	err = migrations.Check(context.Background(), openDB(t, url))
	var behind *migrations.BehindError
	require.ErrorAs(t, err, &behind)
	require.Contains(t, behind.Missing, int64(6))
	require.NotContains(t, behind.Missing, int64(5))
}

// A newer binary migrated the database during a rolling deploy: this one must not
// work with rules it does not know. A rollback recorded by goose's older API (a row
// with is_applied false after the applied one) does not count.
func TestCheck_ADatabaseANewerBinaryMigratedIsAhead(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t)
	conn := connect(t, url)
	_, err := conn.Exec(context.Background(), `INSERT INTO goose_db_version (version_id, is_applied) VALUES (900, true), (901, true), (901, false)`)
	require.NoError(t, err)
	err = migrations.Check(context.Background(), openDB(t, url))
	var ahead *migrations.AheadError
	require.ErrorAs(t, err, &ahead)
	require.Equal(t, int64(900), ahead.Version)
	require.Equal(t, []int64{900}, ahead.Unknown)
	require.Contains(t, err.Error(), "a newer certworker applied migration 00900")
}
