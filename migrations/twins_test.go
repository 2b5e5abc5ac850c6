package migrations_test

import (
	"context"
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/migrations"
)

// Migration 00019 gives rows failed as duplicates by the rule of old (every row of the
// name counted, whatever its state) their name back where the new rule says they keep
// it: a verified acme row whose twin is unverified goes back in the queue, and of two
// verified acme twins the one inserted first does, while the other keeps its failure
// in words that no longer identify the keeper. It backfills ssl_eligible_at.
func TestMigration00019_GivesRowsFailedAsDuplicatesTheirNameBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := legacy(t)
	db := openDB(t, url)
	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS)
	require.NoError(t, err)
	_, err = provider.UpTo(ctx, 18)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `
WITH t AS (INSERT INTO proxy_tenants (name, slug, email) VALUES ('a', 'twins-a', 'a@example.com') RETURNING id)
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider,
                           ssl_attempts, ssl_error, created_at)
SELECT t.id, v.domain, v.verification, 'tok', v.status, 'acme', 3,
       CASE WHEN v.status = 'failed' THEN 'duplicate domain: ' || v.other || ' (0000) has the same name in another case; neither is ordered until one is deleted' END,
       now() - v.age
FROM t, (VALUES ('alone.twins.example', 'verified', 'failed', 'ALONE.twins.example', interval '2 days'),
                ('ALONE.twins.example', 'pending', 'pending', 'alone.twins.example', interval '1 day'),
                ('first.twins.example', 'verified', 'failed', 'FIRST.twins.example', interval '2 days'),
                ('FIRST.twins.example', 'verified', 'failed', 'first.twins.example', interval '1 day'))
     AS v(domain, verification, status, other, age)`)
	require.NoError(t, err)

	_, err = migrations.Up(ctx, db, migrations.Options{})
	require.NoError(t, err)
	for domain, want := range map[string]string{
		"alone.twins.example": "pending", "first.twins.example": "pending", "FIRST.twins.example": "failed",
	} {
		var status string
		var sslError *string
		var attempts int
		require.NoError(t, db.QueryRowContext(ctx, `SELECT ssl_status, ssl_error, ssl_attempts FROM proxy_domains WHERE domain = $1`,
			domain).Scan(&status, &sslError, &attempts))
		require.Equal(t, want, status, domain)
		if want == "pending" {
			require.Nil(t, sslError, domain)
			require.Zero(t, attempts, domain)
			continue
		}
		require.NotNil(t, sslError, domain)
		require.Contains(t, *sslError, "duplicate domain: ", domain)
		require.NotContains(t, *sslError, "first.twins.example", "the failure still names the keeper")
	}
	var missing int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM proxy_domains
WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_eligible_at IS NULL`).Scan(&missing))
	require.Zero(t, missing, "verified acme rows left without ssl_eligible_at")
}
