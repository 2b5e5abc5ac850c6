package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/migrations"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// 00014 on the proxy's database: the profile columns come NULL everywhere, so no
// certificate is up for replacement (one with no recorded profile matches any), and
// run again while the proxy writes both tables (here: an open transaction holding the
// ROW EXCLUSIVE lock every write takes) it takes no lock on them, because it looks in
// the catalogue before ALTER TABLE, which would wait for an ACCESS EXCLUSIVE lock and
// hold every write of the proxy's behind it. Guards against a migrate that replaces
// the fleet's certificates, and against a retried migrate that stops the proxy's
// writes for its lock timeout each time.
func TestUp_ProfileColumnsStartNoReplacementAndARerunTakesNoLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := legacy(t)
	_, err := migrations.Up(ctx, openDB(t, url), migrations.Options{})
	require.NoError(t, err)
	conn := connect(t, url)
	var profiled, recorded int
	require.NoError(t, conn.QueryRow(ctx, `
SELECT (SELECT count(*) FROM proxy_domains WHERE ssl_profile IS NOT NULL OR ssl_profile_refused IS NOT NULL),
       (SELECT count(*) FROM proxy_certificates WHERE profile IS NOT NULL)`).Scan(&profiled, &recorded))
	require.Zero(t, profiled)
	require.Zero(t, recorded)
	// Every tenant setting a profile does not replace a certificate either.
	_, err = conn.Exec(ctx, `UPDATE proxy_domains SET ssl_profile = 'shortlived'`)
	require.NoError(t, err)
	n, err := queue.New(conn, issuing.DefaultConfig()).RequeueProfileChanges(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a certificate with no recorded profile matches any")

	// 00014 and every migration after it run again (goose applies none out of order).
	var again int
	require.NoError(t, conn.QueryRow(ctx, `
WITH d AS (DELETE FROM goose_db_version WHERE version_id >= 14 RETURNING 1) SELECT count(*) FROM d`).Scan(&again))
	require.NoError(t, err)
	proxy := connect(t, url)
	_, err = proxy.Exec(ctx, `BEGIN`)
	require.NoError(t, err)
	_, err = proxy.Exec(ctx, `UPDATE proxy_domains SET updated_at = updated_at WHERE false`)
	require.NoError(t, err)
	_, err = proxy.Exec(ctx, `UPDATE proxy_certificates SET updated_at = updated_at WHERE false`)
	require.NoError(t, err)
	results, err := migrations.Up(ctx, openDB(t, url), migrations.Options{LockTimeout: 200 * time.Millisecond, Attempts: 1})
	require.NoError(t, err, "00014 (or a later one) run again waited for a lock on a table the proxy writes")
	// The numbered ones; the functions step then puts back the function files whose
	// bodies the old migrations replaced (Version 0).
	numbered := 0
	for _, r := range results {
		if r.Version > 0 {
			numbered++
		}
	}
	require.Equal(t, again, numbered)
	require.Equal(t, int64(14), results[0].Version)
	_, err = proxy.Exec(ctx, `ROLLBACK`)
	require.NoError(t, err)
}
