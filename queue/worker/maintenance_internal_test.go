package worker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Two wants for the maintenance timer before its loop takes either (two certificates
// stored at once, say): the sooner is kept whole, with the read that set it, so the
// run it fires logs the bracket its due came from. A want kept with another's due, or
// the sooner due with the later want's read, would log an aim its read cannot
// account for, and a test holding runs to their brackets would fail on a worker that
// aimed right.
func TestWantMaintenance_KeepsTheSoonerAimWithItsOwnRead(t *testing.T) {
	t.Parallel()
	w := &Worker{maintAt: make(chan nextMaint, 1)}
	t0 := time.Now()
	later := aimIn(20*time.Second, t0, t0.Add(3*time.Millisecond), "certificate stored")
	sooner := aimIn(5*time.Second, t0.Add(time.Millisecond), t0.Add(40*time.Millisecond), "renewal information")

	w.wantMaintenance(later)
	w.wantMaintenance(sooner)
	require.Equal(t, sooner, <-w.maintAt)

	w.wantMaintenance(sooner)
	w.wantMaintenance(later)
	require.Equal(t, sooner, <-w.maintAt, "a later want replaced a sooner one")
}

// A renewal time already past when the database read its clock is a delay of 0:
// the aim is due when the answer came, which is within the read's bracket.
func TestAimIn_APastTimeIsDueWhenTheAnswerCame(t *testing.T) {
	t.Parallel()
	readAt := time.Now().Add(-time.Second)
	readDone := readAt.Add(7 * time.Millisecond)
	a := aimIn(-time.Second, readAt, readDone, "after a run: renewal")
	require.Equal(t, readDone, a.due)
	require.Equal(t, readAt, a.readAt)
	require.LessOrEqual(t, a.timer(), timerSlack, "a due already past waits only the slack")
}
