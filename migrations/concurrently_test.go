package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/migrations"
)

// An index on a proxy table is built CONCURRENTLY: while migrate waits for a
// transaction of the proxy's that is writing the table, a third session's INSERT goes
// through at once instead of queueing behind migrate's DDL (issue #17). A plain
// CREATE INDEX asks for a SHARE lock, which waits behind the open write, and every
// later write waits behind that request: the proxy stops for as long as its slowest
// transaction. Migration 00015 is run again with its claim index dropped, the write
// held open until the INSERT is done; the tests that compare the final schema let a
// plain build through.
func TestUp_IndexBuildsDoNotQueueTheProxysWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDB(t)
	admin := connect(t, url)
	_, err := admin.Exec(ctx, `
DROP INDEX proxy_domains_line_idx;
DELETE FROM goose_db_version WHERE version_id >= 15`)
	require.NoError(t, err)
	var tenant string
	require.NoError(t, admin.QueryRow(ctx, `
INSERT INTO proxy_tenants (name, slug, email) VALUES ('t', 't', 't@example.com') RETURNING id::text`).Scan(&tenant))

	writer := connect(t, url)
	_, err = writer.Exec(ctx, `BEGIN`)
	require.NoError(t, err)
	_, err = writer.Exec(ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_token) VALUES ($1, 'open.example', 'tok')`, tenant)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := migrations.Up(ctx, openDB(t, url), migrations.Options{LockTimeout: 30 * time.Second, Attempts: 1})
		done <- err
	}()
	// migrate is at the index build, waiting for the open write.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, admin.QueryRow(ctx, `
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND query ILIKE 'CREATE INDEX%proxy_domains_line_idx%'
  AND wait_event_type = 'Lock'`).Scan(&n))
		return n == 1
	}, 20*time.Second, 20*time.Millisecond, "migrate never waited at the index build")

	third := connect(t, url)
	_, err = third.Exec(ctx, `SET lock_timeout = '1s'`)
	require.NoError(t, err)
	_, err = third.Exec(ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_token) VALUES ($1, 'third.example', 'tok')`, tenant)
	require.NoError(t, err, "the proxy's INSERT queued behind migrate's index build")

	_, err = writer.Exec(ctx, `COMMIT`)
	require.NoError(t, err)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("migrate did not finish once the write committed")
	}
	var valid bool
	require.NoError(t, admin.QueryRow(ctx, `
SELECT indisvalid FROM pg_index WHERE indexrelid = 'proxy_domains_line_idx'::regclass`).Scan(&valid))
	require.True(t, valid)
}
