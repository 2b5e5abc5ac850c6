package issuing_test

import (
	"testing"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/stretchr/testify/require"
)

// --limit-tenant-reserve: a percentage or a fraction, 0 to 50%.
func TestParseTenantReserve(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]float64{"25%": 0.25, "0": 0, "0%": 0, " 50% ": 0.5, "0.1": 0.1, "12.5%": 0.125} {
		got, err := issuing.ParseTenantReserve(in)
		require.NoError(t, err, in)
		require.InDelta(t, want, got, 1e-12, in)
	}
	for _, in := range []string{"", "51%", "-1%", "lots", "NaN", "0.6"} {
		_, err := issuing.ParseTenantReserve(in)
		require.Error(t, err, in)
	}
}

// --limit-consecutive-failures: a count of at least 2 (the name stops at COUNT − 1),
// or off; its bucket refills one a day.
func TestParseConsecutiveFailures(t *testing.T) {
	t.Parallel()
	l, err := issuing.ParseConsecutiveFailures("1152")
	require.NoError(t, err)
	require.Equal(t, 1152, l.Count)
	require.Equal(t, 24*time.Hour, l.Interval())
	l, err = issuing.ParseConsecutiveFailures(" off ")
	require.NoError(t, err)
	require.True(t, l.Off())
	for _, in := range []string{"", "1", "0", "-3", "5/1h", "lots"} {
		_, err := issuing.ParseConsecutiveFailures(in)
		require.Error(t, err, in)
	}
}

// A limit's bucket refills one token every DURATION/COUNT: Let's Encrypt's own
// intervals at the defaults.
func TestLimit_IntervalIsTheRefill(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{
		"300/3h": 36 * time.Second, "50/168h": 12096 * time.Second, "5/168h": 33*time.Hour + 36*time.Minute,
		"5/1h": 12 * time.Minute,
	} {
		l, err := issuing.ParseLimit(in)
		require.NoError(t, err, in)
		require.Equal(t, want, l.Interval(), in)
	}
}
