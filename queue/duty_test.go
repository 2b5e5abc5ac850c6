package queue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A fleet duty has one holder at a time: the first instance to ask takes it, renews
// it while it asks again, and another is told how long the holder's lease has to
// run; once the lease has run out (a holder that died), the next to ask takes it
// over, and the old holder no longer has it. Guards against two instances both doing
// the fleet's work, and against a duty never handed over.
func TestTakeDuty_OneHolderAtATimeTakenOverWhenItsLeaseRunsOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const ttl = time.Minute
	take := func(holder string) (bool, time.Duration) {
		held, left, err := b.q.TakeDuty(b.ctx, "maintenance", holder, ttl)
		require.NoError(t, err)
		return held, left
	}
	held, _ := take("a")
	require.True(t, held, "the first to ask takes the duty")
	held, left := take("b")
	require.False(t, held, "a second holder while the lease holds")
	require.InDelta(t, ttl.Seconds(), left.Seconds(), 5, "how long the holder's lease has to run")
	held, _ = take("a")
	require.True(t, held, "the holder renews")

	_, err := b.pool.Exec(b.ctx, `UPDATE certworker_fleet_duties SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	held, _ = take("b")
	require.True(t, held, "the duty of a holder whose lease ran out is taken over")
	held, _ = take("a")
	require.False(t, held, "the old holder lost it")
	held, _ = take("b")
	require.True(t, held)
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM certworker_fleet_duties`).Scan(&n))
	require.Equal(t, 1, n)

	// Released by its holder (a clean stop), the duty is the next asker's at once; a
	// release by another than the holder releases nothing.
	require.NoError(t, b.q.ReleaseDuty(b.ctx, "maintenance", "a"))
	held, _ = take("a")
	require.False(t, held, "released by one that did not hold it")
	require.NoError(t, b.q.ReleaseDuty(b.ctx, "maintenance", "b"))
	held, _ = take("a")
	require.True(t, held, "the released duty is the next asker's")
}
