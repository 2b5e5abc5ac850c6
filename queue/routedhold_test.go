package queue_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/stretchr/testify/require"
)

// With a second CA the claim reads only what it can take: the rows a hold of the
// first CA keeps back for less than --acme-fallback-after are taken out of line by
// the claim that reads them (HeldRouted), until the moment their decision can change
// (here the hold reaching --acme-fallback-after, before the pause's end), so that no
// later claim reads them again; the next due time is that moment; and when no pause
// is left at all they are back in line at the next claim, for the first CA. They
// stayed in line, and every claim read through all of them.
func TestClaimRouted_TakesRowsHeldAtTheFirstCAOutOfLineUntilTheirDecisionCanChange(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	held := map[string]bool{}
	for i := range 50 {
		held[b.named(t, tn, "n"+strconv.Itoa(i)+".held.example")] = true
	}
	free := map[string]bool{}
	for i := range 5 {
		free[b.named(t, b.tenant(t), "n"+strconv.Itoa(i)+".free.example")] = true
	}
	_, err := b.q.PauseAt(b.ctx, testDirectory, issuing.ScopeRegisteredDomain, "held.example", issuing.PauseRateLimit,
		time.Hour, "too many")
	require.NoError(t, err)
	q := b.routed(10 * time.Minute)

	got := b.claimAll(t, q)
	require.Len(t, got, len(free))
	for id := range got {
		require.True(t, free[id], "a row held back at the first CA was claimed")
	}
	// A row's hold began at the later of its wait's start and the pause's (the pause
	// came after the inserts, by seconds on a loaded machine).
	var out, early, inLine int
	var firstUntil time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT count(*) FILTER (WHERE ssl_held = 'routed'),
       count(*) FILTER (WHERE ssl_held = 'routed' AND ssl_held_until IS DISTINCT FROM
           GREATEST(ssl_waiting_since, (SELECT COALESCE(held_since, created_at) FROM certworker_pauses)) + interval '10 minutes'),
       count(*) FILTER (WHERE ssl_held IS NULL),
       min(ssl_held_until)
FROM proxy_domains WHERE ssl_status = 'pending'`).Scan(&out, &early, &inLine, &firstUntil))
	require.Equal(t, len(held), out, "the rows held back at the first CA are not out of line")
	require.Zero(t, early, "a row is held out until another moment than its hold reaching --acme-fallback-after")
	require.Zero(t, inLine)

	// The next due time is counted from the database's clock as NextDue ran: between
	// the two readings of this one (the host's) clock around the call.
	before := time.Now()
	d, ok, err := q.NextDue(b.ctx, testDirectory)
	after := time.Now()
	require.NoError(t, err)
	require.True(t, ok)
	require.GreaterOrEqual(t, d, firstUntil.Sub(after), "the next due time is not when the first hold reaches --acme-fallback-after")
	require.LessOrEqual(t, d, firstUntil.Sub(before), "the next due time is not when the first hold reaches --acme-fallback-after")

	b.exec(t, `DELETE FROM certworker_pauses`)
	got = b.claimAll(t, q)
	require.Len(t, got, len(held), "a row held out stayed out after every pause ended")
	for id, c := range got {
		require.True(t, held[id])
		require.Equal(t, testDirectory, c.Directory)
	}
}

// A row held out of line by the routed claim comes back when its time comes, and
// then goes to the second CA: its hold has lasted --acme-fallback-after.
func TestClaimRouted_AHeldRowGoesToTheSecondCAWhenItsTimeComes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.named(t, b.tenant(t), "a.held.example")
	_, err := b.q.PauseAt(b.ctx, testDirectory, issuing.ScopeRegisteredDomain, "held.example", issuing.PauseRateLimit,
		time.Hour, "too many")
	require.NoError(t, err)
	q := b.routed(10 * time.Minute)
	require.Empty(t, b.claimAll(t, q))

	// Ten minutes later, as the clock would have it.
	b.exec(t, `UPDATE proxy_domains SET ssl_waiting_since = ssl_waiting_since - interval '10 minutes',
	                                  ssl_queued_at = ssl_queued_at - interval '10 minutes',
	                                  ssl_held_until = ssl_held_until - interval '10 minutes' WHERE id = $1`, id)
	b.exec(t, `UPDATE certworker_pauses SET held_since = held_since - interval '10 minutes'`)
	got := b.claimAll(t, q)
	require.Contains(t, got, id)
	require.Equal(t, secondDirectory, got[id].Directory)
	require.Equal(t, issuing.FallbackRateLimit, got[id].FallbackCause)
}

// A hand-back keeps the start of the row's wait (ssl_waiting_since), though it stamps
// ssl_queued_at again: a domain handed back at each end of a doubling outage pause of
// the first CA goes to the second once --acme-fallback-after has passed since it fell
// due, not since its last hand-back. Measured from ssl_queued_at it went 24 s after
// its verify with --acme-fallback-after 10s, and 63 s with a 30 s poll.
func TestClaimRouted_AHandBackKeepsTheStartOfTheWait(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.named(t, b.tenant(t), "handed.example")
	b.exec(t, `UPDATE proxy_domains SET ssl_waiting_since = now() - interval '30 seconds',
	                                  ssl_queued_at = now() - interval '30 seconds' WHERE id = $1`, id)
	q := b.routed(20 * time.Second)
	claims, err := q.Claim(b.ctx, "test", testDirectory, 1)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	require.Equal(t, testDirectory, claims[0].Directory)

	// The first CA cannot be reached: the outage began with this order, 30 s after
	// the domain fell due, and the claim is handed back uncharged.
	_, err = b.q.PauseUnreachable(b.ctx, testDirectory, "connection refused", time.Minute, time.Minute)
	require.NoError(t, err)
	b.exec(t, `UPDATE certworker_pauses SET held_since = now() - interval '25 seconds'`)
	require.NoError(t, q.Release(b.ctx, claims[0], true))
	var waited, queued float64
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT EXTRACT(epoch FROM now() - ssl_waiting_since), EXTRACT(epoch FROM now() - ssl_queued_at)
FROM proxy_domains WHERE id = $1`, id).Scan(&waited, &queued))
	require.InDelta(t, 30, waited, 5, "the hand-back moved the start of the wait")
	require.Less(t, queued, 5.0, "the hand-back did not stamp ssl_queued_at")

	got := b.claimAll(t, q)
	require.Contains(t, got, id, "the domain waits --acme-fallback-after again from its hand-back")
	require.Equal(t, secondDirectory, got[id].Directory)
	require.Equal(t, issuing.FallbackOutage, got[id].FallbackCause)
}

// ReturnHeld looks the rows it brings back up by their id whatever the statistics
// say: 100,000 rows held out after the last analyze (which saw them in line) were
// read whole, as a semi-join with the candidates, by a call that brought none back.
func TestReturnHeld_LooksUpItsRowsByIDWithStaleStatistics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	b.exec(t, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
SELECT $1, 'h' || g || '.held.example', 'verified', 'tok', 'pending', 'acme' FROM generate_series(1, 100000) g`, tn)
	b.exec(t, `ANALYZE proxy_domains`)
	b.exec(t, `UPDATE proxy_domains SET ssl_held = 'routed', ssl_held_until = now() + interval '1 hour'`)
	rec := &recorder{Pool: b.pool}
	_, err := b.routedOn(rec, time.Hour).ReturnHeld(b.ctx, testDirectory)
	require.NoError(t, err)
	seen := rec.take()
	require.Len(t, seen, 1)
	plan := b.explain(t, seen[0].sql, seen[0].args...)
	require.Contains(t, plan, "proxy_domains_pkey", "ReturnHeld does not look its rows up by id:\n%s", plan)
	require.NotContains(t, plan, "Semi Join", "ReturnHeld matches the held rows with its candidates:\n%s", plan)
}
