package queue_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// A domain handed back to wait for its DNS is pending, uncharged and out of line:
// no claim takes it (ReturnHeld leaves it held) until its wait ends (EndWait), or
// until a retry clears its 'waiting for DNS:' error, the proxy's or certworker's.
// A wait that ends (EndWait) and begins again keeps the time it started waiting, for
// --dns-wait-max; a retry starts that clock over.
// Guards against a waiting domain claimed (and its DNS probed) at every pass, and
// against a retry that does not bring its check forward.
func TestWait_OutOfLineUntilItsWaitEndsOrARetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	id, name := b.domain(t, tenant, "pending", 0, nil)
	// waits claims the domain and hands it back to wait; it returns when the wait began.
	waits := func() time.Time {
		t.Helper()
		c := b.claimOne(t, id)
		require.NoError(t, b.q.Wait(b.ctx, c, issuing.WaitingPrefix+"no such name", "answer-1", queue.WaitCheckFirst))
		var status, held, msg string
		var attempts int
		var since, next, updated time.Time
		require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT d.ssl_status, d.ssl_held, d.ssl_error, d.ssl_attempts, s.waiting_since, s.next_check_at, s.updated_at
FROM proxy_domains d JOIN certworker_dns_state s ON s.domain_id = d.id WHERE d.id = $1`, id).
			Scan(&status, &held, &msg, &attempts, &since, &next, &updated))
		require.Equal(t, "pending", status)
		require.Equal(t, queue.HeldDNS, held)
		require.Equal(t, "waiting for DNS: no such name", msg)
		require.Zero(t, attempts, "waiting is not charged")
		require.Equal(t, queue.WaitCheckFirst, next.Sub(updated).Round(time.Second))
		require.Empty(t, b.drain(t), "out of line while it waits")
		return since
	}

	first := waits()
	st, err := b.q.State(b.ctx, name)
	require.NoError(t, err)
	require.NotNil(t, st.NextAttempt)
	var next time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT next_check_at FROM certworker_dns_state WHERE domain_id = $1`, id).Scan(&next))
	require.True(t, next.Equal(*st.NextAttempt), "status shows the next DNS check (%s), not %s", next, *st.NextAttempt)
	back, err := b.q.EndWait(b.ctx, id)
	require.NoError(t, err)
	require.True(t, back)
	since := waits()
	require.True(t, since.Equal(first), "a wait ended by DNS and begun again started its clock over")

	// The proxy's retry clears the error: the check comes forward, and the clock
	// starts over.
	_, err = b.pool.Exec(b.ctx, `SELECT * FROM certworker_queue_for_issuance($1, $2)`, id, tenant)
	require.NoError(t, err)
	again := waits()
	require.True(t, again.After(since), "the proxy's retry kept the clock of the wait before it")

	// certworker retry does the same.
	require.NoError(t, b.q.Retry(b.ctx, name))
	require.True(t, waits().After(again), "certworker retry kept the clock of the wait before it")

	failed, err := b.q.ExpireWait(b.ctx, id, issuing.WaitingPrefix+"its DNS never pointed here")
	require.NoError(t, err)
	require.True(t, failed)
	require.Equal(t, "failed", b.status(t, id))
}

// DueWaits takes the waits whose check is due and keeps them from another instance
// for a while; it ends the waits of domains no longer waiting. Guards against two
// instances checking one name at once, and a wait left behind by a domain issued
// after a retry checked for ever.
func TestDueWaits_TakesDueChecksOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	id, name := b.domain(t, tenant, "pending", 0, nil)
	c := b.claimOne(t, id)
	require.NoError(t, b.q.Wait(b.ctx, c, issuing.WaitingPrefix+"x", "answer-1", queue.WaitCheckFirst))
	due, _, err := b.q.DueWaits(b.ctx, queue.TakeWaits{Limit: 10})
	require.NoError(t, err)
	require.Empty(t, due, "not due yet")
	_, err = b.pool.Exec(b.ctx, `UPDATE certworker_dns_state SET next_check_at = now() - interval '1 s'`)
	require.NoError(t, err)
	due, stale, err := b.q.DueWaits(b.ctx, queue.TakeWaits{Limit: 10})
	require.NoError(t, err)
	require.Len(t, due, 1)
	require.Equal(t, queue.DueWait{ID: id, TenantID: tenant, Domain: name, Since: due[0].Since, Paced: due[0].Paced, Answer: "answer-1"}, due[0])
	require.Zero(t, stale)
	again, _, err := b.q.DueWaits(b.ctx, queue.TakeWaits{Limit: 10})
	require.NoError(t, err)
	require.Empty(t, again, "taken: another instance does not check it too")

	// Not waiting any more (a retry had it claimed): its wait is ended, not checked.
	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_held = NULL WHERE id = $1`, id)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE certworker_dns_state SET next_check_at = now() - interval '1 s'`)
	require.NoError(t, err)
	due, _, err = b.q.DueWaits(b.ctx, queue.TakeWaits{Limit: 10})
	require.NoError(t, err)
	require.Empty(t, due)
	var next *time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT next_check_at FROM certworker_dns_state WHERE domain_id = $1`, id).Scan(&next))
	require.Nil(t, next)
}

// In its first hour a wait is checked every 10 s, whatever the fleet holds; later at
// least 5 minutes apart, and further apart as the stale waits of the fleet grow, so
// that the fleet checks at most 20 a second. Guards against 100,000 stale names
// costing the resolver and the database a check each every 10 s.
func TestWaitCheckIn_FirstHourFastThenUnderTheFleetBudget(t *testing.T) {
	t.Parallel()
	now := time.Now()
	require.Equal(t, 10*time.Second, queue.WaitCheckIn(now, now.Add(-59*time.Minute), 1_000_000, queue.WaitCheckFirst))
	require.Equal(t, 5*time.Minute, queue.WaitCheckIn(now, now.Add(-2*time.Hour), 10, queue.WaitCheckFirst))
	require.Equal(t, 5000*time.Second, queue.WaitCheckIn(now, now.Add(-2*time.Hour), 100_000, queue.WaitCheckFirst))
}

// A waiting domain is not due by backoff: NextDue, which sets the worker's timer,
// leaves it out (otherwise every pass finds "something due now" while any domain
// waits, and the timer stops following the real next retry). Once retried, the
// waiter's ReturnRetried puts it back in line. Guards against timers degraded to the
// poll interval, and a retry that no pass brings back.
func TestWait_NotDueByBackoffAndReturnedOnceRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	id, name := b.domain(t, tenant, "pending", 0, nil)
	c := b.claimOne(t, id)
	require.NoError(t, b.q.Wait(b.ctx, c, issuing.WaitingPrefix+"x", "a", queue.WaitCheckFirst))
	_, ok, err := b.q.NextDue(b.ctx, testDirectory)
	require.NoError(t, err)
	require.False(t, ok, "nothing is due by backoff")

	n, err := b.q.ReturnRetried(b.ctx, 10)
	require.NoError(t, err)
	require.Zero(t, n, "not retried: left waiting")
	// A retry written around certworker's triggers (a restore, a replica session):
	// ReturnRetried brings it back in line.
	_, err = b.pool.Exec(b.ctx, `BEGIN; SET LOCAL session_replication_role = replica;
UPDATE proxy_domains SET ssl_error = NULL WHERE id = '`+id+`'; COMMIT`)
	require.NoError(t, err)
	n, err = b.q.ReturnRetried(b.ctx, 10)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)

	// certworker retry (and the proxy's): its trigger, certworker_retried, lifts the
	// hold in the same write, so the domain is back in line at once.
	c = b.claimOne(t, id)
	require.NoError(t, b.q.Wait(b.ctx, c, issuing.WaitingPrefix+"x", "a", queue.WaitCheckFirst))
	require.NoError(t, b.q.Retry(b.ctx, name))
	var held *string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ssl_held FROM proxy_domains WHERE id = $1`, id).Scan(&held))
	require.Nil(t, held, "the retry left the domain out of line")
	d, ok, err := b.q.NextDue(b.ctx, testDirectory)
	require.NoError(t, err)
	require.True(t, ok)
	require.LessOrEqual(t, d, time.Duration(0), "due now")
}

// The words of a wait come from the preflight, which quotes what the tenant's DNS and
// web server answered: they are stored through the one sanitiser, as every other
// ssl_error is, whether the wait begins, is rechecked or ends in failure. Guards
// against control characters (a NUL the database refuses, an escape sequence for the
// operator's terminal) and an unbounded answer reaching ssl_error on the wait's path.
func TestWait_ItsWordsAreSanitisedLikeAnyError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	id, _ := b.domain(t, tenant, "pending", 0, nil)
	hostile := issuing.WaitingPrefix + "redirect to \x1b[31mred\x00\x07 " + strings.Repeat("x", 4*queue.MaxErrorBytes)
	stored := func() string {
		t.Helper()
		var msg string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ssl_error FROM proxy_domains WHERE id = $1`, id).Scan(&msg))
		return msg
	}
	check := func(msg string) {
		t.Helper()
		require.True(t, strings.HasPrefix(msg, "waiting for DNS: redirect to "), msg)
		require.NotContains(t, msg, "\x1b")
		require.NotContains(t, msg, "\x00")
		require.NotContains(t, msg, "\x07")
		require.LessOrEqual(t, len(msg), queue.MaxErrorBytes)
	}
	c := b.claimOne(t, id)
	require.NoError(t, b.q.Wait(b.ctx, c, hostile, "answer", queue.WaitCheckFirst))
	check(stored())
	require.NoError(t, b.q.Recheck(b.ctx, id, queue.WaitCheckFirst, queue.WaitCheckFirst, "answer-2", hostile+" again"))
	check(stored())
	failed, err := b.q.ExpireWait(b.ctx, id, hostile)
	require.NoError(t, err)
	require.True(t, failed)
	check(stored())
}

// The --dns-wait-max clock of a domain whose DNS flaps (the check sees it right, the
// wait ends, and the next claim's preflight sees it wrong again) runs across the
// flaps: a domain that waited past the max in waits of minutes each is due to fail,
// as one that waited in one piece. Its issuance starts the clock over: a renewal that
// waits years later is not failed for a wait of its first issuance. Guards against a
// flapping name that never reaches --dns-wait-max, checked for ever.
func TestWait_TheClockRunsAcrossFlapsUntilTheDomainIsIssued(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t), "pending", 0, nil)
	since := func() time.Time {
		t.Helper()
		var s time.Time
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT waiting_since FROM certworker_dns_state WHERE domain_id = $1`, id).Scan(&s))
		return s
	}
	c := b.claimOne(t, id)
	require.NoError(t, b.q.Wait(b.ctx, c, issuing.WaitingPrefix+"x", "a", queue.WaitCheckFirst))
	b.exec(t, `UPDATE certworker_dns_state SET waiting_since = now() - interval '200 hours' WHERE domain_id = $1`, id)
	started := since()
	for range 3 {
		back, err := b.q.EndWait(b.ctx, id)
		require.NoError(t, err)
		require.True(t, back)
		c = b.claimOne(t, id)
		require.NoError(t, b.q.Wait(b.ctx, c, issuing.WaitingPrefix+"x", "a", queue.WaitCheckFirst))
		require.True(t, since().Equal(started), "a wait that ended and began again started its clock over")
	}
	b.exec(t, `UPDATE certworker_dns_state SET next_check_at = now() - interval '1 s' WHERE domain_id = $1`, id)
	due, _, err := b.q.DueWaits(b.ctx, queue.TakeWaits{Limit: 10})
	require.NoError(t, err)
	require.Len(t, due, 1)
	require.True(t, due[0].Since.Equal(started), "the check is not told how long the domain has waited")

	back, err := b.q.EndWait(b.ctx, id)
	require.NoError(t, err)
	require.True(t, back)
	c = b.claimOne(t, id)
	cert := mintCertificate(t, name, nowSecond().Add(-time.Hour), nowSecond().Add(90*24*time.Hour))
	require.NoError(t, b.markActive(c, cert))
	var kept *time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT waiting_since FROM certworker_dns_state WHERE domain_id = $1`, id).Scan(&kept))
	require.Nil(t, kept, "the issuance kept the clock of the wait before it")
	// Its renewal, due.
	b.exec(t, `UPDATE proxy_domains SET ssl_status = 'pending', ssl_renew_by = now() - interval '1 hour',
    ssl_last_attempt_at = NULL WHERE id = $1`, id)
	c = b.claimOne(t, id)
	require.NoError(t, b.q.Wait(b.ctx, c, issuing.WaitingPrefix+"x", "a", queue.WaitCheckFirst))
	require.True(t, since().After(started.Add(199*time.Hour)), "a wait after the issuance kept the clock of one before it")
}

// waitingNow claims the domain and hands it back to wait for its DNS, due at once.
func (b *bundle) waitingNow(t *testing.T, id string) {
	t.Helper()
	c := b.claimOne(t, id)
	require.NoError(t, b.q.Wait(b.ctx, c, issuing.WaitingPrefix+"x", "a", queue.WaitCheckFirst))
	b.exec(t, `UPDATE certworker_dns_state SET next_check_at = now() - interval '1 s' WHERE domain_id = $1`, id)
}

// The due checks are taken round the tenants, each tenant's most overdue first, and
// no more of one tenant than its share, counting the checks it has running on the
// instance; a check taken is kept from the other instances for the lease asked.
// Guards against a tenant with many overdue names taking the whole batch ahead of
// another tenant's name due later, its checks held to their bound.
func TestDueWaits_GoesRoundTheTenantsWithinEachOnesShare(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hog, other := b.tenant(t), b.tenant(t)
	for range 10 {
		id, _ := b.domain(t, hog, "pending", 0, nil)
		b.waitingNow(t, id)
	}
	b.exec(t, `UPDATE certworker_dns_state SET next_check_at = next_check_at - interval '1 hour'`)
	late, _ := b.domain(t, other, "pending", 0, nil)
	b.waitingNow(t, late)

	due, _, err := b.q.DueWaits(b.ctx, queue.TakeWaits{Limit: 4, Share: 4, Busy: map[string]int{hog: 1}, Lease: time.Minute})
	require.NoError(t, err)
	byTenant := map[string]int{}
	for _, d := range due {
		byTenant[d.TenantID]++
	}
	require.Equal(t, map[string]int{hog: 3, other: 1}, byTenant, "one round of every tenant first, and the hog within its share")
	var lease float64
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT EXTRACT(epoch FROM taken_until - now()) FROM certworker_dns_state WHERE domain_id = $1`, late).Scan(&lease))
	require.InDelta(t, 60, lease, 2, "the check is kept from the others for the lease asked")

	due, _, err = b.q.DueWaits(b.ctx, queue.TakeWaits{Limit: 8, Share: 4, Busy: map[string]int{hog: 4}})
	require.NoError(t, err)
	require.Empty(t, due, "the hog has its share running")
}

// A retry brings a waiting name's check forward (the next claim) and starts the clock
// of --dns-wait-max over, but keeps the first hour's pace where it was: a name
// retried over and over is checked at the slow pace once its hour is over. Its
// issuance starts the pace over. Guards against a tenant retrying every few minutes
// to have its names checked every 10 s for ever.
func TestWait_ARetryKeepsTheFirstHoursPace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	id, name := b.domain(t, tenant, "pending", 0, nil)
	b.waitingNow(t, id)
	b.exec(t, `UPDATE certworker_dns_state SET waiting_since = now() - interval '2 hours', paced_since = now() - interval '2 hours'`)
	_, err := b.pool.Exec(b.ctx, `SELECT * FROM certworker_queue_for_issuance($1, $2)`, id, tenant)
	require.NoError(t, err)
	b.waitingNow(t, id)
	due, stale, err := b.q.DueWaits(b.ctx, queue.TakeWaits{Limit: 10})
	require.NoError(t, err)
	require.Len(t, due, 1)
	now := time.Now()
	require.Less(t, now.Sub(due[0].Since), time.Minute, "the retry kept the clock of --dns-wait-max")
	require.Greater(t, now.Sub(due[0].Paced), 119*time.Minute, "the retry restarted the first hour's pace")
	require.Equal(t, 1, stale, "a retried name past its first hour counts among the stale ones")
	require.Equal(t, queue.WaitCheckLater, queue.WaitCheckIn(now, due[0].Paced, stale, queue.WaitCheckFirst))

	back, err := b.q.EndWait(b.ctx, id)
	require.NoError(t, err)
	require.True(t, back)
	c := b.claimOne(t, id)
	require.NoError(t, b.markActive(c, mintCertificate(t, name, nowSecond().Add(-time.Hour), nowSecond().Add(90*24*time.Hour))))
	var paced *time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT paced_since FROM certworker_dns_state WHERE domain_id = $1`, id).Scan(&paced))
	require.Nil(t, paced, "the issuance kept the pace of the wait before it")
}

// A TLS handshake for a waiting name (certworker_name_seen) makes its check due now,
// whatever its age, and its next checks come WaitCheckFirst apart for WaitSeenFor,
// also when the handshake came while a check ran; a handshake older than that
// leaves the slow pace. Guards against a handshake that does not reach the waiter,
// and one lost because a check was running.
func TestNameSeen_ChecksTheNameNowAndEvery10sFor2Minutes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t), "pending", 0, nil)
	b.waitingNow(t, id)
	b.exec(t, `UPDATE certworker_dns_state SET next_check_at = now() + interval '1 hour',
    waiting_since = now() - interval '3 days', paced_since = now() - interval '3 days'`)
	due, _, err := b.q.DueWaits(b.ctx, queue.TakeWaits{Limit: 10})
	require.NoError(t, err)
	require.Empty(t, due)

	var seen bool
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT certworker_name_seen($1)`, strings.ToUpper(name)+".").Scan(&seen))
	require.True(t, seen)
	due, stale, err := b.q.DueWaits(b.ctx, queue.TakeWaits{Limit: 10, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, due, 1, "the handshake did not bring the check forward")
	checkIn := queue.WaitCheckIn(time.Now(), due[0].Paced, stale, queue.WaitCheckFirst)
	require.Equal(t, queue.WaitCheckLater, checkIn)

	next := func() time.Duration {
		t.Helper()
		var s float64
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT EXTRACT(epoch FROM next_check_at - now()) FROM certworker_dns_state WHERE domain_id = $1`, id).Scan(&s))
		return time.Duration(s * float64(time.Second)).Round(time.Second)
	}
	require.NoError(t, b.q.Recheck(b.ctx, id, checkIn, queue.WaitCheckFirst, "a", ""))
	require.Equal(t, queue.WaitCheckFirst, next(), "checked every 10 s after a handshake")

	// A handshake while a check runs: not brought forward (the check runs), but the
	// check's Recheck schedules the next one 10 s on.
	b.exec(t, `UPDATE certworker_dns_state SET seen_at = now() - interval '3 minutes',
    next_check_at = now() + interval '1 minute', taken_until = now() + interval '1 minute'`)
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT certworker_name_seen($1)`, name).Scan(&seen))
	require.True(t, seen)
	require.Equal(t, time.Minute, next(), "a running check was brought forward")
	require.NoError(t, b.q.Recheck(b.ctx, id, checkIn, queue.WaitCheckFirst, "a", ""))
	require.Equal(t, queue.WaitCheckFirst, next(), "the handshake during the check was lost")

	// Two minutes on, the slow pace again.
	b.exec(t, `UPDATE certworker_dns_state SET seen_at = now() - interval '121 seconds'`)
	require.NoError(t, b.q.Recheck(b.ctx, id, checkIn, queue.WaitCheckFirst, "a", ""))
	require.Equal(t, checkIn, next())
}
