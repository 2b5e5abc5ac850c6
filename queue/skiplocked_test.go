package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// workerQueue is a queue on a pool whose sessions have the worker's bounds
// (queue.WorkerSession: a lock wait gives up after 2 s), as the maintenance runs it:
// a statement that waits on a locked row fails with 55P03 rather than hang the test.
func (b *bundle) workerQueue(t *testing.T) *queue.Queue {
	t.Helper()
	return queue.New(b.workerPool(t), issuing.DefaultConfig())
}

// workerPool is a pool whose sessions have the worker's bounds, as workerQueue's.
func (b *bundle) workerPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := queue.NewPoolWith(b.ctx, b.dsn, queue.WorkerSession(issuing.DefaultLease))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// abandoned makes id a claim of an instance that died: 'provisioning' under a token
// whose lease ran out a second ago.
func (b *bundle) abandoned(t *testing.T, id string) {
	t.Helper()
	b.exec(t, `
UPDATE proxy_domains SET ssl_status = 'provisioning', ssl_claim_token = gen_random_uuid(),
    ssl_claimed_by = 'dead/000000', ssl_lease_expires_at = now() - interval '1 second',
    ssl_last_attempt_at = now() - interval '1 minute'
WHERE id = $1`, id)
}

// An instance holding X and Y died mid-order, and the proxy holds X's row in an open
// transaction (a slow request). Y is reclaimed at once, X is passed over, not waited
// for, and reclaimed once the lock is gone. The reclaim was one statement over every
// abandoned row: it waited for X's lock, gave up (55P03) and took Y back with it,
// and Y stayed 'provisioning' for as long as the lock was held.
func TestReclaim_ARowTheProxyHoldsLockedIsPassedOverNotWaitedFor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	x, _ := b.domain(t, tn, "pending", 0, nil)
	y, _ := b.domain(t, tn, "pending", 0, nil)
	b.abandoned(t, x)
	b.abandoned(t, y)
	tx := b.proxyTx(t)
	_, err := tx.Exec(b.ctx, `SELECT 1 FROM proxy_domains WHERE id = $1 FOR UPDATE`, x)
	require.NoError(t, err)

	q := b.workerQueue(t)
	got, err := q.ReclaimAbandoned(b.ctx)
	require.NoError(t, err, "the reclaim waited for the locked row")
	require.Len(t, got, 1)
	require.Equal(t, y, got[0].ID)
	r := b.sslRow(t, y)
	require.Equal(t, "pending", r.Status)
	require.Equal(t, 1, r.Attempts)
	require.Equal(t, "provisioning", b.status(t, x), "the locked row was taken")

	require.NoError(t, tx.Rollback(b.ctx))
	got, err = q.ReclaimAbandoned(b.ctx)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, x, got[0].ID, "the row passed over was not reclaimed once free")
}

// The proxy holds a certificate row without a renewal time locked (its own write of
// the row, not committed yet). The renewal pass gives the other rows their times,
// and requeues the certificates due, whatever that row does. The pass waited for its
// lock, failed, and returned before requeueing anything.
func TestMarkRenewals_ALockedCertificateRowStopsNoRenewalDue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	now := time.Now()
	lockedName := "locked.example"
	b.namedIn(t, tn, lockedName, "active", 0)
	chain, _ := mintPEM(t, lockedName, now.Add(-time.Hour), now.Add(90*24*time.Hour))
	b.putCert(t, lockedName, chain, nil)

	dueName := "due.example"
	due := b.namedIn(t, tn, dueName, "active", 0)
	chain, _ = mintPEM(t, dueName, now.Add(-80*24*time.Hour), now.Add(10*24*time.Hour))
	b.putCert(t, dueName, chain, nil)
	b.exec(t, `UPDATE proxy_certificates SET renew_at = now() - interval '1 hour' WHERE domain = $1`, dueName)

	freeName := "free.example"
	b.namedIn(t, tn, freeName, "active", 0)
	chain, _ = mintPEM(t, freeName, now.Add(-time.Hour), now.Add(90*24*time.Hour))
	b.putCert(t, freeName, chain, nil)

	tx := b.proxyTx(t)
	_, err := tx.Exec(b.ctx, `SELECT 1 FROM proxy_certificates WHERE domain = $1 FOR UPDATE`, lockedName)
	require.NoError(t, err)

	pass, err := b.workerQueue(t).MarkRenewals(b.ctx)
	require.NoError(t, err, "the pass waited for the locked certificate row")
	require.Equal(t, int64(1), pass.Marked)
	require.Equal(t, "pending", b.status(t, due), "the certificate due was not requeued")
	var scheduled, unscheduled int
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT count(*) FILTER (WHERE renew_at IS NOT NULL AND domain = $1), count(*) FILTER (WHERE renew_at IS NULL)
FROM proxy_certificates`, freeName).Scan(&scheduled, &unscheduled))
	require.Equal(t, 1, scheduled, "the free row got no renewal time")
	require.Equal(t, 1, unscheduled, "only the locked row is left without a renewal time")
}

// A pruned row the proxy holds locked (its delete of a domain's certificate, in an
// open transaction) is passed over, and the kinds after it are pruned all the same.
func TestPrune_ALockedRowIsPassedOverAndTheOtherKindsArePruned(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, name := range []string{"gone-a.example", "gone-b.example"} {
		b.putCert(t, name, "pem", nil)
	}
	b.exec(t, `UPDATE proxy_certificates SET updated_at = now() - interval '2 hours'`)
	b.exec(t, `
INSERT INTO certworker_issued_names (directory, name, issued_at) VALUES ('d', 'gone-c.example', now() - interval '2 hours')`)
	tx := b.proxyTx(t)
	_, err := tx.Exec(b.ctx, `SELECT 1 FROM proxy_certificates WHERE domain = 'gone-a.example' FOR UPDATE`)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	r, err := b.workerQueue(t).Prune(ctx)
	require.NoError(t, err, "the prune waited for the locked row")
	require.Equal(t, int64(1), r.Certificates)
	require.Equal(t, int64(1), r.IssuedNames)
}

// A due row the proxy holds locked in an open transaction is passed over: the claim
// returns the other due rows at once. Without SKIP LOCKED nothing is claimed twice
// (PostgreSQL re-checks a locked row once it is free), so only this shows it: the
// claim waited for the lock, and with the worker's lock timeout took nothing at all.
func TestClaim_ALockedDueRowIsPassedOverAndTheOthersClaimedAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	locked, _ := b.domain(t, tn, "pending", 0, nil)
	x, _ := b.domain(t, tn, "pending", 0, nil)
	y, _ := b.domain(t, tn, "pending", 0, nil)
	tx := b.proxyTx(t)
	_, err := tx.Exec(b.ctx, `SELECT 1 FROM proxy_domains WHERE id = $1 FOR UPDATE`, locked)
	require.NoError(t, err)

	claims, err := b.workerQueue(t).Claim(b.ctx, "test", testDirectory, 10)
	require.NoError(t, err, "the claim waited for the locked row")
	var ids []string
	for _, c := range claims {
		ids = append(ids, c.ID)
	}
	require.ElementsMatch(t, []string{x, y}, ids)
	require.Equal(t, "pending", b.status(t, locked))
}

// The same with a second CA: the routed claim reads its head with FOR UPDATE SKIP
// LOCKED too, so a due row the proxy holds locked is passed over and the others are
// claimed at once. Without SKIP LOCKED the routed claim waited for the lock and, with
// the worker's lock timeout, claimed nothing.
func TestClaimRouted_ALockedDueRowIsPassedOverAndTheOthersClaimedAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	locked, _ := b.domain(t, tn, "pending", 0, nil)
	x, _ := b.domain(t, tn, "pending", 0, nil)
	y, _ := b.domain(t, tn, "pending", 0, nil)
	tx := b.proxyTx(t)
	_, err := tx.Exec(b.ctx, `SELECT 1 FROM proxy_domains WHERE id = $1 FOR UPDATE`, locked)
	require.NoError(t, err)

	claims, err := b.routedOn(b.workerPool(t), time.Minute).Claim(b.ctx, "test", testDirectory, 10)
	require.NoError(t, err, "the routed claim waited for the locked row")
	var ids []string
	for _, c := range claims {
		ids = append(ids, c.ID)
		require.Equal(t, testDirectory, c.Directory, "%s went to the second CA with no pause of the first", c.ID)
	}
	require.ElementsMatch(t, []string{x, y}, ids)
	require.Equal(t, "pending", b.status(t, locked))
}

// Two urgent renewals of one tenant, the proxy holding the one of earliest expiry
// locked. The claim serves the tenant's urgent turn with its due renewal of earliest
// ssl_renew_by (picks), which reads the tenant's urgent renewals again, locking them:
// with SKIP LOCKED there too, the locked row is passed over and the other renewal is
// claimed at once. Without it, picks waited for the proxy's lock and, with the
// worker's lock timeout, the claim failed and took nothing.
func TestClaim_UrgentTurnPassesOverARenewalTheProxyHoldsLocked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	b.urgentRenewal(t, tn, "first.example", 2*24*time.Hour)
	b.urgentRenewal(t, tn, "second.example", 3*24*time.Hour)
	tx := b.proxyTx(t)
	_, err := tx.Exec(b.ctx, `SELECT 1 FROM proxy_domains WHERE domain = 'first.example' FOR UPDATE`)
	require.NoError(t, err)

	claims, err := b.workerQueue(t).Claim(b.ctx, "test", testDirectory, 10)
	require.NoError(t, err, "the urgent turn waited for the locked renewal")
	var names []string
	for _, c := range claims {
		names = append(names, c.Domain)
	}
	require.Equal(t, []string{"second.example"}, names)
	var status string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ssl_status FROM proxy_domains WHERE domain = 'first.example'`).Scan(&status))
	require.Equal(t, "pending", status, "the locked renewal was taken")
}
