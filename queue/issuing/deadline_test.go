package issuing_test

import (
	"context"
	"testing"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/stretchr/testify/require"
)

// The deadline runs from the send of the claim or of a renewal the database
// confirmed, a lease less the margin, on the monotonic clock; a renewal that answers
// late never moves it back; nil is no deadline.
func TestDeadline_RunsALeaseLessTheMarginFromTheLastSend(t *testing.T) {
	t.Parallel()
	const lease = 3 * time.Second
	require.Equal(t, 150*time.Millisecond, issuing.LeaseMargin(lease))
	sent := time.Now()
	d := issuing.NewDeadline(sent, lease)
	require.Equal(t, sent.Add(lease-issuing.LeaseMargin(lease)), d.At())
	require.NoError(t, d.Check())

	d.Renewed(sent.Add(time.Second))
	require.Equal(t, sent.Add(time.Second+lease-issuing.LeaseMargin(lease)), d.At())
	d.Renewed(sent) // an older renewal answering late
	require.Equal(t, sent.Add(time.Second+lease-issuing.LeaseMargin(lease)), d.At())

	past := issuing.NewDeadline(time.Now().Add(-lease), lease)
	require.ErrorIs(t, past.Check(), issuing.ErrLeaseDeadline)
	ctx, cancel := past.Bound(context.Background())
	defer cancel()
	<-ctx.Done()
	require.ErrorIs(t, context.Cause(ctx), issuing.ErrLeaseDeadline)

	var none *issuing.Deadline
	require.NoError(t, none.Check())
	ctx, cancel = none.Bound(context.Background())
	require.NoError(t, ctx.Err())
	cancel()
}

// A bound follows the deadline as renewals move it: a wait that began under the old
// deadline does not end at it.
func TestDeadline_BoundFollowsRenewals(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	d := issuing.NewDeadline(time.Now(), lease)
	ctx, cancel := d.Bound(context.Background())
	defer cancel()
	first := d.At()
	d.Renewed(time.Now().Add(2 * time.Second))
	select {
	case <-ctx.Done():
		t.Fatalf("the bound ended at the deadline as it stood before the renewal")
	case <-time.After(time.Until(first) + 300*time.Millisecond):
	}
	<-ctx.Done()
	require.ErrorIs(t, context.Cause(ctx), issuing.ErrLeaseDeadline)
	require.False(t, time.Now().Before(d.At()), "the bound ended before the deadline")
}

// Expire ends a deadline at once and for good: Check fails, a wait Bound made ends
// with ErrLeaseDeadline, and a renewal confirmed later does not bring it back (the
// shutdown expires an order it hands back itself).
func TestDeadline_ExpireEndsItForGood(t *testing.T) {
	t.Parallel()
	d := issuing.NewDeadline(time.Now(), time.Hour)
	ctx, cancel := d.Bound(context.Background())
	defer cancel()
	require.NoError(t, d.Check())
	d.Expire()
	require.ErrorIs(t, d.Check(), issuing.ErrLeaseDeadline)
	select {
	case <-ctx.Done():
		require.ErrorIs(t, context.Cause(ctx), issuing.ErrLeaseDeadline)
	case <-time.After(10 * time.Second):
		t.Fatal("a wait bound by the deadline did not end")
	}
	d.Renewed(time.Now())
	require.ErrorIs(t, d.Check(), issuing.ErrLeaseDeadline, "a renewal brought an expired deadline back")
}

// A killed instance's claim is taken back within two leases of it
// (internal/fakeworker's TestProcess_KilledMidOrderIsIssuedByAnotherWithinTwoLeases,
// at a lease the test scales down), and docs/high-availability.md promises it within
// 2 minutes with the default lease: the default must stay at most a minute.
func TestDefaultLease_TakesAKilledInstancesClaimBackWithinTwoMinutes(t *testing.T) {
	t.Parallel()
	require.LessOrEqual(t, 2*issuing.DefaultLease, 2*time.Minute)
	require.Equal(t, issuing.DefaultLease, issuing.DefaultConfig().Lease)
}
