package queue_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A retry that lifts a hold (a row held out of line: a backoff, a pause, a DNS wait)
// gives the row a place as a row entering the queue gets one from the wake trigger:
// one past its tenant's last in its tier, never before the tier's front. The row was
// pending all along, so the wake trigger does not fire for it; without a new place it
// kept the one it held before, here far behind the line, and was served after every
// row of a tenant whose backlog came later. Both paths of the proxy's retry: a row
// with a history for the retry trigger to clear, and one with none. Guards against a
// retried domain served out of the fair order, behind or ahead of its turn.
func TestRetry_AHeldRowRetriedTakesAPlaceAsARowEnteringTheQueue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		attempts int
		secsAgo  *int
	}{
		{"with a history", 2, ago(60)},
		{"with none", 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			busy, other := b.tenant(t), b.tenant(t)
			for range 5 {
				b.domain(t, busy, "pending", 0, nil)
			}
			held, _ := b.domain(t, other, "pending", tc.attempts, tc.secsAgo)
			b.exec(t, `UPDATE proxy_domains SET ssl_held = 'backoff', ssl_queue_seq = 1000 WHERE id = $1`, held)

			// The place the wake trigger gives a row of the held row's tenant entering
			// the queue now.
			var want int64
			tx, err := b.pool.Begin(b.ctx)
			require.NoError(t, err)
			require.NoError(t, tx.QueryRow(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
VALUES ($1, 'probe.example', 'verified', 'tok', 'pending', 'acme') RETURNING ssl_queue_seq`, other).Scan(&want))
			require.NoError(t, tx.Rollback(b.ctx))

			ok, err := b.q.QueueForIssuance(b.ctx, held, other)
			require.NoError(t, err)
			require.True(t, ok)
			var seq int64
			var heldNow *string
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ssl_queue_seq, ssl_held FROM proxy_domains WHERE id = $1`, held).
				Scan(&seq, &heldNow))
			require.Nil(t, heldNow, "the retry left the row out of line")
			require.Equal(t, want, seq, "the retried row kept its old place")

			claims, err := b.q.Claim(b.ctx, "test", testDirectory, 1)
			require.NoError(t, err)
			require.Len(t, claims, 1)
			require.Equal(t, held, claims[0].ID, "the retried row of a tenant with nothing else in line is served at the front")
		})
	}
}
