package queue_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// certworker retry forgets every CA's refusal of the name, also for a
// pending row with no history to clear (attempts 0, no error, no last attempt: a
// first issuance refused by one CA and handed back uncharged), where the retry
// trigger, keyed on a cleared history, does not fire. Guards against a refusal that
// survives the operator's retry and keeps the name from that CA.
func TestRetry_ForgetsARefusalOfARowWithNoHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t), "pending", 0, nil)
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_ca_refused = 'https://ca.example/dir', ssl_ca_refused_cause = 'caa'
WHERE id = $1`, id)
	require.NoError(t, err)
	require.NoError(t, b.q.Retry(b.ctx, name))
	var refused, cause *string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ssl_ca_refused, ssl_ca_refused_cause FROM proxy_domains WHERE id = $1`, id).
		Scan(&refused, &cause))
	require.Nil(t, refused, "retry kept a CA's refusal")
	require.Nil(t, cause)
}
