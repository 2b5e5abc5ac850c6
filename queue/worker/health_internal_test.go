package worker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A process paused past half a lease (SIGSTOP, a VM frozen) saw no statement fail,
// yet did not reach the database meanwhile: it counts as down, so that its reclaim
// waits a full lease after its return and its own stopped orders are handed back,
// uncharged, first. Without it, an instance resumed after a pause reclaimed its own
// expired claims at once, and charged them an attempt.
func TestDBHealth_ASilenceLongerThanHalfALeaseCountsAsAnOutage(t *testing.T) {
	t.Parallel()
	const lease = time.Minute
	h := newDBHealth(lease)
	h.upSince = time.Now().Add(-time.Hour)
	h.lastOK = time.Now().Add(-lease / 4) // renewals every third of a lease
	require.Greater(t, h.upFor(), 59*time.Minute)
	h.ok()
	require.Greater(t, h.upFor(), 59*time.Minute, "a success within half a lease started the count again")

	h.lastOK = time.Now().Add(-lease/2 - time.Second) // the pause
	require.Zero(t, h.upFor(), "a silence of more than half a lease counts as up")
	h.ok()
	require.Less(t, h.upFor(), lease, "the first success after the silence did not start the count again")
}
