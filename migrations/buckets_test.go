package migrations_test

import (
	"context"
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/migrations"
)

// The token buckets start from what the ledger holds, under the limits the fleet last
// recorded: the account's bucket after three orders 10 and 5 minutes ago and now, at
// 3 an hour (one token every 20 minutes), has its theoretical arrival time where the
// ledger's own GCRA would have put it, the oldest order plus three intervals. Orders
// the CA did not count (not sent, renewals) take no token, and a limit the fleet
// recorded as off starts no bucket.
func TestMigrationTokenBuckets_StartFromTheLedger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := legacy(t)
	db := openDB(t, url)
	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS)
	require.NoError(t, err)
	_, err = provider.UpTo(ctx, 25)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `
INSERT INTO certworker_settings (id, limits) VALUES (true, '{"orders_per_account": {"count": 3, "window_seconds": 3600}, "certs_per_exact_set": null}')
ON CONFLICT (id) DO UPDATE SET limits = EXCLUDED.limits`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `
INSERT INTO certworker_ledger (at, directory, name, registered_domain, renewal, outcome)
VALUES (now() - interval '10 minutes', 'https://ca.invalid/d', 'a.example', 'a.example', false, 'issued'),
       (now() - interval '5 minutes', 'https://ca.invalid/d', 'b.example', 'b.example', false, 'failed'),
       (now(), 'https://ca.invalid/d', 'c.example', 'c.example', false, 'pending'),
       (now(), 'https://ca.invalid/d', 'd.example', 'd.example', false, 'not_sent'),
       (now(), 'https://ca.invalid/d', 'e.example', 'e.example', true, 'issued')`)
	require.NoError(t, err)

	_, err = migrations.Up(ctx, db, migrations.Options{})
	require.NoError(t, err)
	got := lines(t, url, `
SELECT kind || ' ' || key || ' ' || round(extract(epoch FROM tat - (SELECT min(at) FROM certworker_ledger)))
FROM certworker_buckets ORDER BY kind, key`)
	require.Equal(t, []string{"account https://ca.invalid/d 3600"}, got)
}
