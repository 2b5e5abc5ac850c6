package issuing_test

import (
	"math"
	"testing"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/stretchr/testify/require"
)

func TestBackoff_GrowsThenStops(t *testing.T) {
	t.Parallel()
	c := issuing.DefaultConfig()
	// One minute, doubling.
	require.Equal(t, time.Minute, c.Backoff(0))
	require.Equal(t, 2*time.Minute, c.Backoff(1))
	require.Equal(t, 16*time.Minute, c.Backoff(4))
	// Capped, so a domain that will never validate is neither retried on a schedule
	// measured in days nor hammered for ever.
	require.Equal(t, c.RetryMax, c.Backoff(8))
	require.Equal(t, c.RetryMax, c.Backoff(20))
	require.Equal(t, c.RetryMax, c.Backoff(math.MaxInt32))
	require.Equal(t, c.RetryMax, c.Backoff(math.MaxInt))
}

// The bug this guards against: clamping the shift below the point where the cap
// binds, which leaves the cap as dead code and silently changes the longest gap. The
// first attempt to reach the cap must be within the attempt limit.
func TestBackoff_CapIsReachable(t *testing.T) {
	t.Parallel()
	c := issuing.DefaultConfig()
	first := -1
	for n := 0; n <= c.MaxAttempts; n++ {
		if c.Backoff(n) == c.RetryMax {
			first = n
			break
		}
	}
	require.NotEqual(t, -1, first, "the cap is never reached within MaxAttempts")
	require.Less(t, first, c.MaxAttempts, "capped only at the last attempt")
}

// ssl_attempts is a signed column, so a hand-edited row can be negative; a shift by
// a negative count panics in Rust's debug builds and is meaningless in Go.
func TestBackoff_NegativeCountIsTheFirstStep(t *testing.T) {
	t.Parallel()
	c := issuing.DefaultConfig()
	require.Equal(t, time.Minute, c.Backoff(-1))
	require.Equal(t, time.Minute, c.Backoff(math.MinInt32))
	require.Equal(t, time.Minute, c.Backoff(math.MinInt))
}

// The claim in DefaultMaxAttempts' comment, checked rather than asserted in prose.
func TestBackoff_TenAttemptsSpanAboutADay(t *testing.T) {
	t.Parallel()
	c := issuing.DefaultConfig()
	var total time.Duration
	for n := range c.MaxAttempts {
		total += c.Backoff(n)
	}
	require.GreaterOrEqual(t, total, 12*time.Hour, "ten attempts span %s", total)
	require.LessOrEqual(t, total, 48*time.Hour, "ten attempts span %s", total)
}

// A fixed 30 days before expiry would renew any certificate shorter than that on
// every poll, and leave a 90-day one a month to notice a problem. A third of the
// lifetime keeps the month for 90 days and scales down; below 10 days half the
// lifetime is left (docs/cas.md, renewal times), as Let's Encrypt advises for its
// 6-day certificates: a third would leave 2 days to notice a failing renewal.
func TestRenewAtFromValidity_LeavesRoomToNotice(t *testing.T) {
	t.Parallel()
	day := 24 * time.Hour
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		lifetime, renewAfter time.Duration
	}{
		{90 * day, 60 * day},
		{45 * day, 30 * day},
		{10 * day, 10 * day * 2 / 3},                       // the boundary: a third left
		{10*day - time.Second, (10*day - time.Second) / 2}, // just under it: half left
		{160 * time.Hour, 80 * time.Hour},                  // Let's Encrypt's shortlived
		{6 * day, 3 * day},
		{6 * time.Minute, 3 * time.Minute},
	} {
		got := issuing.RenewAtFromValidity(start, start.Add(tc.lifetime))
		require.Equal(t, start.Add(tc.renewAfter), got, "lifetime %s", tc.lifetime)
	}
	remaining := 90*24*time.Hour - 60*24*time.Hour
	require.GreaterOrEqual(t, remaining, 14*24*time.Hour)
}
