package issuing_test

import (
	"testing"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/stretchr/testify/require"
)

// The time to ask the CA again is its Retry-After clamped to between a minute and a
// day (RFC 9773 §4.3), then spread over a tenth of itself so that certificates issued
// together are not asked about together for ever: upward (Retry-After is the earliest
// the CA wants to be asked), never past a day.
func TestRenewalInfoIn_ClampedAndJittered(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		retryAfter, from, to time.Duration
	}{
		{0, 6 * time.Hour, 6*time.Hour + 36*time.Minute}, // none given: six hours
		{6 * time.Hour, 6 * time.Hour, 6*time.Hour + 36*time.Minute},
		{10 * time.Second, time.Minute, time.Minute + 6*time.Second}, // at least a minute
		{23 * time.Hour, 23 * time.Hour, 24 * time.Hour},             // never past a day
		{72 * time.Hour, 24*time.Hour - 144*time.Minute, 24 * time.Hour},
	} {
		seen := map[time.Duration]bool{}
		for range 50 {
			d := issuing.RenewalInfoIn(tc.retryAfter)
			require.GreaterOrEqual(t, d, tc.from, "Retry-After %s", tc.retryAfter)
			require.LessOrEqual(t, d, tc.to, "Retry-After %s", tc.retryAfter)
			seen[d] = true
		}
		require.Greater(t, len(seen), 40, "Retry-After %s: no jitter", tc.retryAfter)
	}
	d := issuing.RenewalInfoRetryIn()
	require.GreaterOrEqual(t, d, issuing.RenewalInfoAfterError)
	require.LessOrEqual(t, d, issuing.RenewalInfoAfterError*11/10)
}
