package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// Claimed an hour ago and never finished: a restart mid-order, or a database error on
// the way to recording the result. Nothing else moves a row out of 'provisioning', so
// without the reaper this domain silently never gets a certificate.
func TestReclaim_ADomainAbandonedMidIssuanceIsRequeued(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "provisioning", 0, ago(3600))
	got, err := b.q.ReclaimAbandoned(b.ctx)
	require.NoError(t, err)
	require.Len(t, got, 1, "the abandoned domain was not requeued")
	require.True(t, b.claimsInclude(t, id), "a requeued domain must be claimable again")
	var attempts int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ssl_attempts FROM proxy_domains WHERE id = $1`, id).Scan(&attempts))
	// The interrupted order was still an order. Without counting it, a proxy
	// crash-looping during issuance would retry without limit.
	require.Equal(t, 1, attempts, "the interrupted attempt was not counted")
}

// Claimed a minute ago, without a lease (the Rust worker's claim): inside the grace,
// so another worker may still be ordering it. Reclaiming here would have two workers
// ordering the same certificate.
func TestReclaim_ALiveOrderIsNotStolenFromTheWorkerRunningIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "provisioning", 0, ago(60))
	got, err := b.q.ReclaimAbandoned(b.ctx)
	require.NoError(t, err)
	require.Empty(t, got, "a live order was reclaimed")
	require.Equal(t, "provisioning", b.status(t, id))
}

// A slow order claimed long ago whose instance keeps renewing its lease is live,
// however long it has run: only the lease decides.
func TestReclaim_ALongOrderWithARenewedLeaseIsNotStolen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "pending", 0, nil)
	c := b.claimOne(t, id)
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_last_attempt_at = now() - interval '1 hour' WHERE id = $1`, id)
	require.NoError(t, err)
	leases, err := b.q.Heartbeat(b.ctx, []string{c.Token})
	require.NoError(t, err)
	require.Equal(t, []string{c.Token}, leases.Renewed)
	got, err := b.q.ReclaimAbandoned(b.ctx)
	require.NoError(t, err)
	require.Empty(t, got, "a live order with a renewed lease was reclaimed")
}

// A statement's now() is its transaction's start, before it is planned; its snapshot
// is taken after. A renewal that commits in between is seen with a lease ending
// later than now() + a lease, which the guard against hand-edited leases took for a
// lease run out: on a busy server, where planning takes a while, the reclaim of one
// instance took a live order another had just renewed (seen under load: the CA saw
// the domain ordered twice). Here the reclaim runs in a transaction begun before the
// renewal.
func TestReclaim_ALeaseRenewedAfterTheReclaimsTransactionBeganIsNotTakenForRunOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "pending", 0, nil)
	c := b.claimOne(t, id)
	tx := b.beganBefore(t, func() {
		leases, err := b.q.Heartbeat(b.ctx, []string{c.Token})
		require.NoError(t, err)
		require.Equal(t, []string{c.Token}, leases.Renewed)
	})
	got, err := queue.New(tx, issuing.DefaultConfig()).ReclaimAbandoned(b.ctx)
	require.NoError(t, err)
	require.Empty(t, got, "a lease renewed a moment ago was reclaimed")
	require.NoError(t, tx.Commit(b.ctx))
	require.Equal(t, "provisioning", b.status(t, id))
}

// The same for the heartbeat: an instance's renewal (the heartbeat's, or the check
// before a finalize) that commits after another renewal of the same claim began saw
// the lease as run out, and stopped its own live order.
func TestHeartbeat_ALeaseRenewedAfterItsTransactionBeganIsRenewedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "pending", 0, nil)
	c := b.claimOne(t, id)
	tx := b.beganBefore(t, func() {
		_, err := b.q.ConfirmClaim(b.ctx, c.Token)
		require.NoError(t, err)
	})
	leases, err := queue.New(tx, issuing.DefaultConfig()).Heartbeat(b.ctx, []string{c.Token})
	require.NoError(t, err)
	require.Equal(t, []string{c.Token}, leases.Renewed, "expired %v, busy %v, lost %v", leases.Expired, leases.Busy, leases.Lost)
	require.NoError(t, tx.Commit(b.ctx))
}

// beganBefore begins a transaction, runs between once the transaction's now() is in
// the past, and returns the transaction: its next statement reads what between
// committed, with a now() from before it. Rolled back when the test ends, unless
// committed.
func (b *bundle) beganBefore(t *testing.T, between func()) pgx.Tx {
	t.Helper()
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	var began time.Time
	require.NoError(t, tx.QueryRow(b.ctx, `SELECT now()`).Scan(&began))
	// The database's clock has moved past the transaction's start (clock_timestamp()
	// is read afresh at every call).
	for {
		var past bool
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT clock_timestamp() > $1::timestamptz + interval '1 millisecond'`, began).Scan(&past))
		if past {
			break
		}
	}
	between()
	return tx
}

// The instance died: its lease ran out. The domain is requeued, and the instance,
// should it come back, learns from its next heartbeat that the claim is gone.
func TestReclaim_AnExpiredLeaseIsReclaimedAndItsHolderToldSo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "pending", 0, nil)
	c := b.claimOne(t, id)
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_lease_expires_at = now() - interval '1 second' WHERE id = $1`, id)
	require.NoError(t, err)
	got, err := b.q.ReclaimAbandoned(b.ctx)
	require.NoError(t, err)
	require.Len(t, got, 1)
	leases, err := b.q.Heartbeat(b.ctx, []string{c.Token})
	require.NoError(t, err)
	require.Equal(t, []string{c.Token}, leases.Lost)
	// And its late result is dropped rather than written over the new claim.
	_, err = b.q.MarkFailed(b.ctx, c, "late")
	require.Error(t, err)
	require.True(t, b.claimsInclude(t, id), "a reclaimed domain must be claimable at once")
}

// A hand-edited 'provisioning' row with no timestamps at all is not stuck for ever:
// updated_at stands in for the missing last attempt.
func TestReclaim_AProvisioningRowWithNullTimestampsIsNotStuck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "provisioning", 0, nil)
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET updated_at = now() - interval '1 hour' WHERE id = $1`, id)
	require.NoError(t, err)
	got, err := b.q.ReclaimAbandoned(b.ctx)
	require.NoError(t, err)
	require.Len(t, got, 1)
}

func TestReclaim_LeavesOtherProvidersAndStatesAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	pending, _ := b.domain(t, tn, "pending", 0, ago(3600))
	active, _ := b.domain(t, tn, "active", 0, ago(3600))
	// Provisioning, long ago, but not an ACME domain: no business of this worker.
	var manual string
	require.NoError(t, b.pool.QueryRow(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token,
    ssl_status, ssl_provider, ssl_last_attempt_at)
VALUES ($1, 'manual.example', 'verified', 'tok', 'provisioning', 'manual', now() - interval '1 hour')
RETURNING id::text`, tn).Scan(&manual))
	got, err := b.q.ReclaimAbandoned(b.ctx)
	require.NoError(t, err)
	require.Empty(t, got, "reclaimed something it should not have")
	for id, want := range map[string]string{pending: "pending", active: "active", manual: "provisioning"} {
		require.Equal(t, want, b.status(t, id), "a row was changed that should not have been")
	}
}

// At the attempt limit a reclaim fails the domain, as any other failure does,
// instead of leaving it 'pending' where nothing will ever claim it.
func TestReclaim_AtTheLimitTheDomainFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "provisioning", 9, ago(3600))
	got, err := b.q.ReclaimAbandoned(b.ctx)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.True(t, got[0].GaveUp)
	require.Equal(t, "failed", b.status(t, id))
}

// A hand-edited row at the top of int4 must not make the reclaim statement fail: it
// moves every abandoned row at once, so one bad row would leave all of them stuck.
func TestReclaim_AHugeAttemptCountDoesNotBlockTheOthers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	huge, _ := b.domain(t, tn, "provisioning", 2147483647, ago(3600))
	normal, _ := b.domain(t, tn, "provisioning", 0, ago(3600))
	got, err := b.q.ReclaimAbandoned(b.ctx)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, "failed", b.status(t, huge))
	require.Equal(t, "pending", b.status(t, normal))
}

// A row the Rust worker claimed ('provisioning', no lease) while the two run side by
// side during a cutover: it may still be ordering it, for up to its own 15 minutes, so
// taking it back sooner orders the domain twice. After 15 minutes it is an abandoned
// claim, and is requeued.
func TestReclaim_TheReferencesClaimIsTakenBackOnlyAfterItsOwn15Minutes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	live, _ := b.domain(t, tn, "provisioning", 0, ago(14*60))
	abandoned, _ := b.domain(t, tn, "provisioning", 0, ago(16*60))
	got, err := b.q.ReclaimAbandoned(b.ctx)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, abandoned, got[0].ID)
	require.Equal(t, "provisioning", b.status(t, live), "the reference's live order was taken from it")
	require.Equal(t, "pending", b.status(t, abandoned))
}
