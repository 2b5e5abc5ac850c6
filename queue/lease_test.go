package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/stretchr/testify/require"
)

// A lease that ran out is not renewed, even though nobody took the row: an instance
// coming back from a partition or a pause longer than the lease must not re-assert a
// claim the rest of the fleet may already treat as abandoned. Its holder hands it back
// instead; until then the reclaim may take it.
func TestHeartbeat_DoesNotRenewALeaseThatRanOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	expiredID, _ := b.domain(t, tn, "pending", 0, nil)
	expired := b.claimOne(t, expiredID)
	liveID, _ := b.domain(t, tn, "pending", 0, nil)
	live := b.claimOne(t, liveID)
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_lease_expires_at = now() - interval '1 second' WHERE id = $1`, expiredID)
	require.NoError(t, err)

	leases, err := b.q.Heartbeat(b.ctx, []string{expired.Token, live.Token})
	require.NoError(t, err)
	require.Equal(t, []string{expired.Token}, leases.Expired)
	require.Equal(t, []string{live.Token}, leases.Renewed)
	require.Empty(t, leases.Lost)

	var ranOut bool
	require.NoError(t, b.pool.QueryRow(b.ctx,
		`SELECT ssl_lease_expires_at < now() FROM proxy_domains WHERE id = $1`, expiredID).Scan(&ranOut))
	require.True(t, ranOut, "the heartbeat renewed a lease that had run out")
	got, err := b.q.ReclaimAbandoned(b.ctx)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, expiredID, got[0].ID)
	// Its holder, handing it back now, finds it gone.
	require.ErrorIs(t, b.q.Release(b.ctx, expired, false), issuing.ErrClaimLost)
}

// One row held by another transaction (the proxy's open write to that domain) does
// not hold up the renewal of the others: it is skipped and reported busy, and the
// statement does not wait for the lock, which would let every lease of the instance
// run out behind one proxy transaction.
func TestHeartbeat_SkipsARowAnotherTransactionHoldsAndRenewsTheRest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	lockedID, _ := b.domain(t, tn, "pending", 0, nil)
	locked := b.claimOne(t, lockedID)
	freeID, _ := b.domain(t, tn, "pending", 0, nil)
	free := b.claimOne(t, freeID)

	lockRow(t, b, lockedID)

	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	leases, err := b.q.Heartbeat(ctx, []string{locked.Token, free.Token})
	require.NoError(t, err, "the heartbeat waited for the row lock")
	require.Equal(t, []string{free.Token}, leases.Renewed)
	require.Equal(t, []string{locked.Token}, leases.Busy)
	require.Empty(t, leases.Lost)
	require.Empty(t, leases.Expired)
}

// The check before a finalize renews the claim's lease under its token, with the
// heartbeat's statement, and says how much is left on the database's clock; it
// refuses a claim the database does not hold: another instance's token on the row,
// or a row pending again after a failover to a standby that never received the
// claim (no token at all), a lease that ran out, and a row another transaction
// holds (not waited for). Without it, only the heartbeat noticed a lost claim, a
// third of a lease later, after the finalize had made the CA issue.
func TestConfirmClaim_RenewsAHeldClaimAndRefusesTheRest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	lease := b.q.Config().Lease
	heldID, _ := b.domain(t, tn, "pending", 0, nil)
	held := b.claimOne(t, heldID)
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_lease_expires_at = now() + interval '10 seconds' WHERE id = $1`, heldID)
	require.NoError(t, err)
	left, err := b.q.ConfirmClaim(b.ctx, held.Token)
	require.NoError(t, err)
	require.Greater(t, left, lease*2/3, "renewed to a full lease")
	require.LessOrEqual(t, left, lease)
	var dbLeft float64
	require.NoError(t, b.pool.QueryRow(b.ctx,
		`SELECT EXTRACT(epoch FROM ssl_lease_expires_at - now()) FROM proxy_domains WHERE id = $1`, heldID).Scan(&dbLeft))
	require.Greater(t, dbLeft, (lease * 2 / 3).Seconds(), "the row's lease was not renewed")

	// Pending again, as on a standby promoted before it received the claim.
	lostID, _ := b.domain(t, tn, "pending", 0, nil)
	lost := b.claimOne(t, lostID)
	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_status = 'pending', ssl_claim_token = NULL, ssl_lease_expires_at = NULL WHERE id = $1`, lostID)
	require.NoError(t, err)
	_, err = b.q.ConfirmClaim(b.ctx, lost.Token)
	require.ErrorIs(t, err, issuing.ErrClaimLost)

	expiredID, _ := b.domain(t, tn, "pending", 0, nil)
	expired := b.claimOne(t, expiredID)
	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_lease_expires_at = now() - interval '1 second' WHERE id = $1`, expiredID)
	require.NoError(t, err)
	_, err = b.q.ConfirmClaim(b.ctx, expired.Token)
	require.ErrorIs(t, err, issuing.ErrLeaseDeadline)

	lockedID, _ := b.domain(t, tn, "pending", 0, nil)
	locked := b.claimOne(t, lockedID)
	lockRow(t, b, lockedID)
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	_, err = b.q.ConfirmClaim(ctx, locked.Token)
	require.ErrorIs(t, err, issuing.ErrClaimBusy)
}

// lockRow holds the domain's row locked in a transaction of its own, as the proxy's
// open write to it does, until the test ends.
func lockRow(t *testing.T, b *bundle, id string) {
	t.Helper()
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(b.ctx) })
	_, err = tx.Exec(b.ctx, `UPDATE proxy_domains SET updated_at = now() WHERE id = $1`, id)
	require.NoError(t, err)
}
