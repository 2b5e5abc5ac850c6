package queue_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// nextDue is NextDue as a time on this host's clock (the delay is the database's;
// the container shares the host's clock, within the tolerance the tests allow).
func (b *bundle) nextDue(t *testing.T) (time.Time, bool) {
	t.Helper()
	d, ok, err := b.q.NextDue(b.ctx, testDirectory)
	require.NoError(t, err)
	return time.Now().Add(d), ok
}

// nextMaintenance is the earlier of NextMaintenance's times, on this host's clock.
func (b *bundle) nextMaintenance(t *testing.T) (time.Time, bool) {
	t.Helper()
	m, err := b.q.NextMaintenance(b.ctx)
	require.NoError(t, err)
	var d *time.Duration
	for _, x := range []*time.Duration{m.Renewals, m.Reclaim} {
		if x != nil && (d == nil || *x < *d) {
			d = x
		}
	}
	if d == nil {
		return time.Time{}, false
	}
	return time.Now().Add(*d), true
}

// tolerance covers the round trip between the database's clock and this process's.
const tolerance = time.Second

// Nothing scheduled reads as not ok, which the worker takes as "sleep until the
// poll": any time would set a timer for something that means nothing.
func TestNextDue_NothingForAnEmptyQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, ok := b.nextDue(t)
	require.False(t, ok)
	_, ok = b.nextMaintenance(t)
	require.False(t, ok)
}

// Rows no pass will take must not schedule a wake-up: a failed domain, one at the
// attempt limit, an unverified or manual one, a certificate the tenant does not want
// renewed. A wake time in the past for any of them would spin the worker.
func TestNextDue_IgnoresWhatNoPassWillTake(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	b.domain(t, tn, "failed", 10, ago(60))
	b.domain(t, tn, "pending", 10, ago(24*3600))
	b.insert(t, tn, "pending", "pending", "acme")
	b.insert(t, tn, "verified", "pending", "manual")
	_, off := b.domain(t, tn, "active", 0, ago(3600))
	b.storeCert(t, off, "pem", time.Now().Add(day), timePtr(time.Now().Add(-day)), false)
	manual := b.domainName(t, b.insert(t, tn, "verified", "active", "manual"))
	b.storeCert(t, manual, "pem", time.Now().Add(day), timePtr(time.Now().Add(-day)), true)
	at, ok := b.nextDue(t)
	require.False(t, ok, "scheduled a pass at %s for nothing", at)
	at, ok = b.nextMaintenance(t)
	require.False(t, ok, "scheduled maintenance at %s for nothing", at)
}

// A domain never tried is due now: the worker must take it on this pass, not after
// a backoff it has not earned.
func TestNextDue_NowForANeverTriedDomain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.domain(t, b.tenant(t), "pending", 0, nil)
	d, ok, err := b.q.NextDue(b.ctx, testDirectory)
	require.NoError(t, err)
	require.True(t, ok)
	require.Zero(t, d)
}

// A failed attempt is retried exactly when its backoff runs out, by the same curve
// the claim query applies: the point of the timer is a retry at 2 minutes rather than
// at the next poll, and a timer that fires early finds nothing to claim. Every attempt
// count, below and at the cap of the curve, and a negative one.
func TestNextDue_TheEndOfABackoff(t *testing.T) {
	t.Parallel()
	for _, attempts := range []int{-3, 1, 2, 7, 8, 9} {
		b := setup(t)
		id, _ := b.domain(t, b.tenant(t), "pending", attempts, ago(30))
		last := b.sslRow(t, id).LastAttempt
		require.NotNil(t, last)
		at, ok := b.nextDue(t)
		require.True(t, ok)
		require.WithinDuration(t, last.Add(b.q.Config().Backoff(attempts)), at, tolerance, "attempts %d", attempts)
	}
}

// While the CA is paused nothing is claimable, so the next pass is at the pause's end,
// not at a backoff that ends inside it; a pause of a registered domain or a name ends
// a wait too (the names it held are due again).
func TestNextDue_PausesEndIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.domain(t, b.tenant(t), "pending", 0, nil)
	_, err := b.q.Pause(b.ctx, issuing.ScopeCA, testDirectory, issuing.PauseRateLimit, time.Hour, "slow down")
	require.NoError(t, err)
	at, ok := b.nextDue(t)
	require.True(t, ok)
	require.WithinDuration(t, time.Now().Add(time.Hour), at, tolerance)

	other := setup(t)
	id, _ := other.domain(t, other.tenant(t), "pending", 1, ago(0))
	_, err = other.q.Pause(other.ctx, issuing.ScopeDomain, "x.example", issuing.PauseLedger, 10*time.Second, "ledger")
	require.NoError(t, err)
	at, ok = other.nextDue(t)
	require.True(t, ok)
	require.WithinDuration(t, time.Now().Add(10*time.Second), at, tolerance,
		"the backoff of %s ends later; the pause ends first", id)
}

// A pause the ledger wrote for the CA's account (--limit-orders-per-account) does not
// postpone the next pass to its end: a renewal passes it (ledgerExemptSQL), so a
// renewal held for its backoff is due when the backoff ends, as the claim judges it
// row by row. Taking it for the CA's own pause would hold the renewal until the
// pause's end, a week away: only the timer's passes bring held rows back.
func TestNextDue_ALedgersPauseOfTheAccountDoesNotPostponeABackoff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "pending", 1, ago(0))
	last := b.sslRow(t, id).LastAttempt
	require.NotNil(t, last)
	_, err := b.q.Pause(b.ctx, issuing.ScopeCA, testDirectory, issuing.PauseLedger, 7*day, "ledger: the account's orders")
	require.NoError(t, err)
	at, ok := b.nextDue(t)
	require.True(t, ok)
	require.WithinDuration(t, last.Add(b.q.Config().Backoff(1)), at, tolerance)
}

// An active certificate wakes the maintenance at its renewal time, so a 6-day
// certificate is renewed at 4 days and not at whatever poll comes after.
func TestNextMaintenance_TheRenewalTimeOfAnActiveCertificate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, name := b.domain(t, b.tenant(t), "active", 0, ago(3600))
	at := time.Now().Add(3 * time.Hour)
	b.storeCert(t, name, "pem", time.Now().Add(day), &at, true)
	got, ok := b.nextMaintenance(t)
	require.True(t, ok)
	require.WithinDuration(t, at, got, tolerance)
}

// A claim's lease expiry is when an order abandoned by a dead instance becomes
// reclaimable: the maintenance must look then, or the domain waits for a poll.
func TestNextMaintenance_TheLeaseExpiryOfAClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "pending", 0, nil)
	b.claimOne(t, id)
	lease := b.sslRow(t, id).Lease
	require.NotNil(t, lease)
	got, ok := b.nextMaintenance(t)
	require.True(t, ok)
	require.WithinDuration(t, *lease, got, tolerance)
}

// With several things scheduled, the earliest wins: a timer set for a later one
// would miss the earlier.
func TestNextMaintenance_TheEarliestOfSeveral(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	_, active := b.domain(t, tn, "active", 0, ago(3600))
	renewAt := time.Now().Add(2 * time.Hour)
	b.storeCert(t, active, "pem", time.Now().Add(day), &renewAt, true)
	got, _ := b.nextMaintenance(t)
	require.WithinDuration(t, renewAt, got, tolerance)

	claimed, _ := b.domain(t, tn, "pending", 0, nil)
	b.claimOne(t, claimed)
	got, _ = b.nextMaintenance(t)
	require.WithinDuration(t, *b.sslRow(t, claimed).Lease, got, tolerance)
}

// NextDue runs on every pass of every worker: its statement is planned generic once
// the server has tried it a few times, not planned afresh at each call. Guards
// against the number of attempt counts it reads one index entry for as a parameter
// (generate_series up to $5): the generic plan guesses a thousand rows where a
// custom one sees eight, looks costlier, and the server planned every call again
// (5.5 ms of planning for 0.15 ms of execution at a million domains).
func TestNextDue_IsPlannedOnceNotAtEveryCall(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A fleet at rest: nearly every domain active, a few in the queue, the statistics known.
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider,
    ssl_expires_at)
SELECT $1, 'rest' || g || '.example', 'verified', 'tok', 'active', 'acme', now() + interval '60 days'
FROM generate_series(1, 20000) g`, b.tenant(t))
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_status = 'pending' WHERE domain LIKE 'rest1%' AND length(domain) < 14`)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `VACUUM ANALYZE proxy_domains`)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(b.dsn)
	require.NoError(t, err)
	queue.ConfigurePool(cfg)
	cfg.MaxConns = 1 // one session: its prepared statements are the ones looked at
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	q := queue.New(pool, issuing.DefaultConfig())
	for range 10 {
		_, _, err := q.NextDue(b.ctx, testDirectory)
		require.NoError(t, err)
	}
	var generic, custom int64
	require.NoError(t, pool.QueryRow(b.ctx, `
SELECT generic_plans, custom_plans FROM pg_prepared_statements
WHERE statement LIKE '%per_count AS%' AND statement NOT LIKE '%pg_prepared_statements%'`).Scan(&generic, &custom))
	require.Positive(t, generic, "every call planned afresh (%d custom plans)", custom)
	require.LessOrEqual(t, custom, int64(5), "the server tries five custom plans before it weighs the generic one")
}

// NextDueSeeing names the announced commits its own snapshot did not see: a
// transaction still running is unseen, and once it has ended the same look sees it,
// and its row is due. The worker looks again until none is unseen, because a logical
// stream announces a commit a moment before a new snapshot sees it.
func TestNextDueSeeing_NamesTheCommitsItsSnapshotDidNotSee(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck
	_, err = tx.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
VALUES ($1, 'unseen.example', 'verified', 'tok', 'pending', 'acme')`, tn)
	require.NoError(t, err)
	var full uint64
	require.NoError(t, tx.QueryRow(b.ctx, `SELECT pg_current_xact_id()::text::numeric`).Scan(&full))
	xid := uint32(full)

	var ended uint64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::numeric - 1`).Scan(&ended))
	_, ok, unseen, err := b.q.NextDueSeeing(b.ctx, testDirectory, []uint32{uint32(ended), xid})
	require.NoError(t, err)
	require.False(t, ok, "the row is not visible yet")
	require.Equal(t, []uint32{xid}, unseen, "only the running transaction is unseen")

	require.NoError(t, tx.Commit(b.ctx))
	d, ok, unseen, err := b.q.NextDueSeeing(b.ctx, testDirectory, []uint32{xid})
	require.NoError(t, err)
	require.Empty(t, unseen)
	require.True(t, ok)
	require.LessOrEqual(t, d, time.Duration(0), "the committed row is due now")

	d, ok, unseen, err = b.q.NextDueSeeing(b.ctx, testDirectory, nil)
	require.NoError(t, err)
	require.Nil(t, unseen)
	require.True(t, ok)
	require.LessOrEqual(t, d, time.Duration(0))
}
