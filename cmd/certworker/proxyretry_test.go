package main

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// The proxy's retry (certworker_queue_for_issuance), run under the proxy's role of
// deploy/grants.sql, forgets every CA's refusal of the name, as `certworker retry` does, also for a
// row with no history to clear (pending, attempts 0, no error, no last attempt: a
// first issuance refused by one CA and handed back uncharged), which the retry
// trigger, keyed on a cleared history, does not see; and the row is claimed at that
// CA at once. Guards against a refusal only `certworker retry` forgets, and against a
// fix that needs the proxy's role to write certworker's columns.
func TestGrants_TheProxysRetryForgetsARefusalOfARowWithNoHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	adminDSN, proxyDSN := proxyRoleDB(t)
	admin, err := pgxpool.New(ctx, adminDSN)
	require.NoError(t, err)
	defer admin.Close()
	proxy, err := pgx.Connect(ctx, proxyDSN)
	require.NoError(t, err)
	defer proxy.Close(ctx)

	const dir = "https://ca.invalid/dir"
	tenant := pgtest.Tenant(t, admin)
	id := pgtest.Domain(t, admin, tenant, "refused-once.example")
	_, err = admin.Exec(ctx, `UPDATE proxy_domains SET ssl_ca_refused = $2, ssl_ca_refused_cause = 'refused'
WHERE id = $1`, id, dir)
	require.NoError(t, err)

	var n int
	require.NoError(t, proxy.QueryRow(ctx, `SELECT count(*) FROM certworker_queue_for_issuance($1, $2)`, id, tenant).Scan(&n))
	require.Equal(t, 1, n, "the proxy's retry did not queue the domain")
	var refused, cause, held *string
	var attempts int
	require.NoError(t, admin.QueryRow(ctx, `SELECT ssl_ca_refused, ssl_ca_refused_cause, ssl_held, ssl_attempts
FROM proxy_domains WHERE id = $1`, id).Scan(&refused, &cause, &held, &attempts))
	require.Nil(t, refused, "the proxy's retry kept the CA's refusal")
	require.Nil(t, cause, "the proxy's retry kept the refusal's cause")
	require.Nil(t, held)
	require.Zero(t, attempts)

	claims, err := queue.New(admin, issuing.DefaultConfig()).Claim(ctx, "test", dir, 10)
	require.NoError(t, err)
	require.Len(t, claims, 1, "the retried domain is not claimable at the CA that refused it")
	require.Equal(t, id, claims[0].ID)
	require.Empty(t, claims[0].RefusedBy)
}
