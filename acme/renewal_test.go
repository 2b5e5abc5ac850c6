package acme_test

import (
	"testing"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/stretchr/testify/require"
)

// The renewal time inside a CA's window, at its edges, for a 90-day certificate
// whose last tenth (9 days) is kept back. Guards against the panic of a window that
// starts inside the last tenth (5 to 3 days before expiry: rand.Int64N of a
// negative span, after the certificate was issued, so the domain was charged), a
// window already over renewing at once in a loop, a time past expiry, and a time in
// the window's last tenth, whose order could reach the CA after the window and lose
// its exemption from the CA's limits.
func TestRenewAtFromWindow_Edges(t *testing.T) {
	t.Parallel()
	day := 24 * time.Hour
	notBefore := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	notAfter := notBefore.Add(90 * day)
	latest := notAfter.Add(-9 * day)
	now := notBefore.Add(time.Hour)
	for _, tc := range []struct {
		name       string
		start, end time.Time
		now        time.Time
		ok         bool
		lo, hi     time.Time // the time is in [lo, hi), or exactly lo when lo == hi
	}{
		{"window well before the last tenth", notBefore.Add(59 * day), notBefore.Add(61 * day), now, true,
			notBefore.Add(59 * day), notBefore.Add(61 * day)},
		{"window running into the last tenth is cut at it", notAfter.Add(-10 * day), notAfter.Add(-2 * day), now, true,
			notAfter.Add(-10 * day), latest},
		{"window inside the last tenth renews at its start", notAfter.Add(-5 * day), notAfter.Add(-3 * day), now, true,
			notAfter.Add(-5 * day), notAfter.Add(-5 * day)},
		{"window starting exactly at the last tenth renews at its start", latest, notAfter.Add(-time.Hour), now, true,
			latest, latest},
		{"window past expiry starting in the last tenth renews at its start", notAfter.Add(-day), notAfter.Add(day), now, true,
			notAfter.Add(-day), notAfter.Add(-day)},
		{"window already open starts now", now.Add(-time.Hour), now.Add(day), now, true, now, now.Add(day)},
		{"window open while already in the last tenth renews now", notAfter.Add(-6 * day), notAfter.Add(-time.Hour),
			notAfter.Add(-4 * day), true, notAfter.Add(-4 * day), notAfter.Add(-4 * day)},
		{"the window's last tenth is kept back", now, now.Add(100 * time.Second), now, true, now, now.Add(90 * time.Second)},
		{"window whose first nine tenths are over renews now", now.Add(-time.Hour), now.Add(2 * time.Minute), now, true,
			now, now},
		{"window over", now.Add(-2 * time.Hour), now.Add(-time.Hour), now, false, time.Time{}, time.Time{}},
		{"window ending now is over", now.Add(-time.Hour), now, now, false, time.Time{}, time.Time{}},
		{"window starting at expiry", notAfter, notAfter.Add(day), now, false, time.Time{}, time.Time{}},
		{"reversed window", now.Add(2 * day), now.Add(day), now, false, time.Time{}, time.Time{}},
		{"empty window", now.Add(day), now.Add(day), now, false, time.Time{}, time.Time{}},
		{"no window", time.Time{}, time.Time{}, now, false, time.Time{}, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for range 200 {
				got, ok := issuing.RenewAtFromWindow(tc.start, tc.end, notBefore, notAfter, tc.now)
				require.Equal(t, tc.ok, ok)
				if !ok {
					require.True(t, got.IsZero())
					continue
				}
				if tc.lo.Equal(tc.hi) {
					require.Equal(t, tc.lo, got)
					continue
				}
				require.False(t, got.Before(tc.lo), "%s before %s", got, tc.lo)
				require.True(t, got.Before(tc.hi), "%s not before %s", got, tc.hi)
			}
		})
	}
}
