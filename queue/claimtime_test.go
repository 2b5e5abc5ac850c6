package queue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// A row that becomes due after the claim statement arrived but before its snapshot
// (a renewal marked, a domain verified, while the claim is planned on a busy server)
// is claimed at a time after it became due: its last attempt, its lease's start, the
// claim's ClaimedAt and its history's claimed event are never before its queued time
// or its verified event. Here the claim waits at its Bind, for a lock its cached plan
// needs, held by another transaction while the proxy verifies the domain. Guards
// against a claim stamped with now(), the statement's arrival (the CI run of 3be922f:
// a renewal "claimed" 16 ms before its renewal time, a negative wake latency).
func TestClaim_ARowThatBecameDueWhileTheClaimWaitedIsClaimedAfterIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	id := b.insert(t, tenant, "pending", "pending", "acme")

	// One session, so the claim's statement is prepared before the wait: pgx prepares
	// it on first use, and the wait must come at the Bind, after the statement began.
	conn, err := b.pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	var claimPID int
	require.NoError(t, conn.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&claimPID))
	q := queue.New(conn.Conn(), issuing.DefaultConfig())
	none, err := q.ClaimInLine(b.ctx, "test", testDirectory, 1, 0)
	require.NoError(t, err)
	require.Empty(t, none, "the domain is not verified yet")

	hold, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(b.ctx) }()
	_, err = hold.Exec(b.ctx, `LOCK TABLE certworker_pauses IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	type result struct {
		claims []issuing.Claim
		err    error
	}
	done := make(chan result, 1)
	go func() {
		claims, err := q.ClaimInLine(b.ctx, "test", testDirectory, 1, 0)
		done <- result{claims, err}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		require.NoError(t, b.pool.QueryRow(b.ctx,
			`SELECT wait_event_type IS NOT DISTINCT FROM 'Lock' FROM pg_stat_activity WHERE pid = $1`, claimPID).Scan(&waiting))
		if waiting {
			break
		}
		require.True(t, time.Now().Before(deadline), "the claim never waited for the lock")
		time.Sleep(5 * time.Millisecond)
	}
	var statementStart time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT xact_start FROM pg_stat_activity WHERE pid = $1`, claimPID).Scan(&statementStart))

	// The proxy verifies the domain while the claim waits.
	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET verification_status = 'verified' WHERE id = $1`, id)
	require.NoError(t, err)
	require.NoError(t, hold.Rollback(b.ctx))

	r := <-done
	require.NoError(t, r.err)
	require.Len(t, r.claims, 1, "the domain verified while the claim waited is in its snapshot")
	require.Equal(t, id, r.claims[0].ID)

	var lastAttempt, queuedAt, leaseEnd time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx,
		`SELECT ssl_last_attempt_at, ssl_queued_at, ssl_lease_expires_at FROM proxy_domains WHERE id = $1`, id).
		Scan(&lastAttempt, &queuedAt, &leaseEnd))
	require.True(t, statementStart.Before(queuedAt), "the claim's statement began (%s) before the domain was queued (%s)", statementStart, queuedAt)
	require.False(t, lastAttempt.Before(queuedAt), "claimed at %s, before the domain was queued at %s", lastAttempt, queuedAt)
	require.True(t, r.claims[0].ClaimedAt.Equal(lastAttempt), "the claim's ClaimedAt %s is its last attempt %s", r.claims[0].ClaimedAt, lastAttempt)
	require.Equal(t, issuing.DefaultLease, leaseEnd.Sub(lastAttempt), "the lease starts at the claim")

	rows, err := b.pool.Query(b.ctx, `SELECT event, at FROM certworker_domain_events WHERE domain_id = $1 ORDER BY id`, id)
	require.NoError(t, err)
	var events []string
	var at []time.Time
	for rows.Next() {
		var e string
		var a time.Time
		require.NoError(t, rows.Scan(&e, &a))
		events, at = append(events, e), append(at, a)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"verified", "claimed"}, events)
	require.False(t, at[1].Before(at[0]), "the history has the claim (%s) before the verification (%s)", at[1], at[0])
	require.True(t, at[1].Equal(lastAttempt), "the claimed event at %s is the claim's time %s", at[1], lastAttempt)
}
