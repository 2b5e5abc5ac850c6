package queue_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// A claimable row at or above --max-attempts, which no claim takes and no failure
// write reaches, is marked failed, with what its last attempt said and why it stopped;
// a row below the limit, one not verified, and one the proxy holds locked are left
// (the last without waiting for it). They waited in 'pending' for ever, shown as
// retrying.
func TestFailExhausted_FailsWhatNoClaimWillTake(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	at, _ := b.domain(t, tn, "pending", 10, ago(60))
	b.exec(t, `UPDATE proxy_domains SET ssl_error = 'acme: urn:ietf:params:acme:error:dns: NXDOMAIN' WHERE id = $1`, at)
	above, _ := b.domain(t, tn, "pending", 12, nil)
	below, _ := b.domain(t, tn, "pending", 9, ago(60))
	unverified := b.insert(t, tn, "pending", "pending", "acme")
	b.exec(t, `UPDATE proxy_domains SET ssl_attempts = 11 WHERE id = $1`, unverified)
	locked, _ := b.domain(t, tn, "pending", 10, ago(60))
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck
	_, err = tx.Exec(b.ctx, `SELECT 1 FROM proxy_domains WHERE id = $1 FOR UPDATE`, locked)
	require.NoError(t, err)

	failed, err := b.q.FailExhausted(b.ctx)
	require.NoError(t, err)
	var ids []string
	for _, f := range failed {
		ids = append(ids, f.ID)
	}
	require.ElementsMatch(t, []string{at, above}, ids)
	for id, want := range map[string]string{
		at:    "acme: urn:ietf:params:acme:error:dns: NXDOMAIN (given up: 10 attempts, at or above --max-attempts 10; `certworker retry` puts it back)",
		above: "(given up: 12 attempts, at or above --max-attempts 10; `certworker retry` puts it back)",
	} {
		r := b.sslRow(t, id)
		require.Equal(t, "failed", r.Status)
		require.Equal(t, want, *r.Error)
	}
	for _, id := range []string{below, unverified, locked} {
		require.Equal(t, "pending", b.status(t, id), fmt.Sprint("row ", id))
	}
}
