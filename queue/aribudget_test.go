package queue_test

import (
	"math"
	"testing"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/stretchr/testify/require"
)

// The fleet's renewal-information budget is one bucket per CA in the database: it
// holds a second's worth (at least one), hands out what it holds and says how long
// until a batch is there again, refills on the database's clock, takes back what was
// not spent, and keeps each CA's apart.
func TestTakeRenewalInfoTokens_OneBucketPerCAShared(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const ca, other = "https://ca.invalid/directory", "https://other.invalid/directory"
	take := func(dir string, want int, rate float64) (int, time.Duration) {
		t.Helper()
		got, wait, err := b.q.TakeRenewalInfoTokens(b.ctx, dir, want, rate)
		require.NoError(t, err)
		return got, wait
	}

	got, wait := take(ca, 16, 10)
	require.Equal(t, 10, got, "a full bucket holds a second's worth")
	require.InDelta(t, time.Second.Seconds(), wait.Seconds(), 0.05, "10 more at 10 a second")
	got, _ = take(other, 16, 10)
	require.Equal(t, 10, got, "another CA's bucket is its own")

	// A slow rate: one token at most, and the next a hundred seconds later.
	got, wait = take("https://slow.invalid/directory", 5, 0.01)
	require.Equal(t, 1, got)
	require.InDelta(t, 100, wait.Seconds(), 1)
	got, _ = take("https://slow.invalid/directory", 5, 0.01)
	require.Zero(t, got, "a second token within a hundred seconds")
	require.NoError(t, b.q.ReturnRenewalInfoTokens(b.ctx, "https://slow.invalid/directory", 1, 0.01))
	got, _ = take("https://slow.invalid/directory", 5, 0.01)
	require.Equal(t, 1, got, "a returned token is taken again")

	// Refilled by the database's clock: half a second later, half the bucket (and
	// what the time between the two statements added).
	b.exec(t, `UPDATE certworker_ari_buckets SET tokens = 0, refilled_at = clock_timestamp() - interval '500 milliseconds' WHERE directory = $1`, ca)
	got, _ = take(ca, 16, 10)
	require.GreaterOrEqual(t, got, 5)
	require.LessOrEqual(t, got, 6)
	b.exec(t, `UPDATE certworker_ari_buckets SET refilled_at = refilled_at - interval '1 hour' WHERE directory = $1`, ca)
	got, _ = take(ca, 16, 10)
	require.Equal(t, 10, got, "an idle hour fills the bucket, not beyond")

	for _, rate := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		_, _, err := b.q.TakeRenewalInfoTokens(b.ctx, ca, 1, rate)
		require.ErrorIs(t, err, issuing.ErrBadRate, "rate %v", rate)
	}
}
