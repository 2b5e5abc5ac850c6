package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
)

// Two rows that differ only in case, neither verified and acme (so neither keeps the
// name) and neither spelled as typed: `status` and `retry` name both and act on
// neither (exit 1), rather than show or requeue whichever the database returns first.
func TestCLI_StatusAndRetryRefuseANameTwoDomainsHold(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	execSQL(t, dsn, `
WITH t AS (INSERT INTO proxy_tenants (name, slug, email) VALUES ('t', 't', 't@example.com') RETURNING id)
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider, ssl_attempts)
SELECT id, d, 'pending', 'tok', 'failed', 'acme', 10 FROM t, (VALUES ('shop.example'), ('Shop.Example')) AS v(d)`)
	for _, args := range [][]string{
		{"status", "SHOP.example", "--database-url", dsn},
		{"retry", "shop.EXAMPLE", "--database-url", dsn},
	} {
		code, stdout, stderr := invoke(t, args...)
		require.Equal(t, exitFailed, code, "%v: %s", args, stderr)
		require.Empty(t, stdout)
		require.Contains(t, stderr, "matches 2 domains that differ only in case: Shop.Example (", args)
		require.Contains(t, stderr, "shop.example (", args)
	}
	code, stdout, _ := invoke(t, "status", "--json", "--database-url", dsn)
	require.Equal(t, exitOK, code)
	require.Contains(t, stdout, `"failed": 2`, "an ambiguous retry requeued a domain")
}
