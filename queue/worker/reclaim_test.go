package worker_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// reclaimDeadline is the bound docs/high-availability.md promises: a killed
// instance's claim is claimable again within 2 minutes of it, whatever other rows the proxy holds locked.
const reclaimDeadline = 2 * time.Minute

// abandon makes id a claim of an instance that was killed: 'provisioning' under a
// token of its own whose lease ran out a second ago.
func (b *bundle) abandon(t *testing.T, id string) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `
UPDATE proxy_domains SET ssl_status = 'provisioning', ssl_claim_token = gen_random_uuid(),
    ssl_claimed_by = 'killed/000000', ssl_lease_expires_at = now() - interval '1 second',
    ssl_last_attempt_at = now() - interval '1 minute'
WHERE id = $1`, id)
	require.NoError(t, err)
}

// An instance holding X and Y was killed mid-order, and the proxy holds X's row in an
// open transaction, as a slow request does. Y is ordered again by another instance
// well within the 2 minutes, and X waits for the lock, still 'provisioning'. Y was
// still 'provisioning' 150 s after the kill: the one reclaim statement gave up on X's
// lock and took Y back with it, and its failure shut the reclaim's gate for a lease.
func TestWorker_AKilledInstancesClaimsAreReclaimedPastARowTheProxyHoldsLocked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	x, _ := b.domain(t, tn)
	y, yName := b.domain(t, tn)
	b.abandon(t, x)
	b.abandon(t, y)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck
	_, err = tx.Exec(b.ctx, `SELECT 1 FROM proxy_domains WHERE id = $1 FOR UPDATE`, x)
	require.NoError(t, err)

	fake := fakeissuer.New(10)
	b.start(t, "survivor", worker.Config{Issuer: fake, Queue: issuing.Config{Lease: 4 * time.Second},
		PollInterval: 500 * time.Millisecond})
	b.waitStatus(t, y, "active", reclaimDeadline)
	require.Equal(t, 1, fake.Count(yName))
	require.Equal(t, "provisioning", b.status(t, x), "the locked row was taken while the proxy held it")
}

// Another step fails on every pass with a lock timeout: here the claim, on a table
// the proxy holds locked. The database answers all along, so the reclaim's gate
// opens after a lease, and the killed instance's claim is put back. The gate was
// "no statement failed for a full lease": reset by every failing step, it stayed shut
// for as long as any step failed more often than once a lease, and nothing was
// reclaimed.
func TestWorker_ARecurringLockTimeoutInAnotherStepDoesNotStopTheReclaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	y, _ := b.domain(t, b.tenant(t))
	b.abandon(t, y)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck
	// Every claim reads the pauses; the reclaim, the heartbeat and the renewal pass
	// do not. The lease is long enough that a step's deadline (a quarter of it) comes
	// after the server's lock timeout (2 s): the claim fails with the server's 55P03,
	// as it does with the default lease.
	_, err = tx.Exec(b.ctx, `LOCK TABLE certworker_pauses IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	in := b.start(t, "survivor", worker.Config{Issuer: fakeissuer.New(10), Queue: issuing.Config{Lease: 12 * time.Second},
		PollInterval: 200 * time.Millisecond})
	workertest.Eventually(t, reclaimDeadline, "the abandoned claim to be put back", func() bool {
		return b.row(t, y).Status == "pending"
	})
	r := b.row(t, y)
	require.Equal(t, 1, r.Attempts, "the interrupted attempt was not counted")
	require.Nil(t, r.Token)
	require.Equal(t, "issuance was interrupted before it finished", *r.Error)
	require.NotZero(t, len(in.Logs.FilterMessage("database step failed; will try again").All()),
		"the claim did not fail: the test does not test what it says")
}
