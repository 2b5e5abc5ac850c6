package queue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// The ledger's limits are token buckets, as the CA counts them: a burst of COUNT, then
// one token every DURATION/COUNT. The limits are scaled down (seconds where the CA
// has hours) so that each test is short; the times asserted are the ledger rows'
// and the pauses', on the database's clock.

// untilDue does what the worker does after a refusal: a claim (which takes nothing,
// and holds the refused rows out of line under their pause), then a wait until
// NextDue says something is due, the moment the worker's timer would fire. It
// returns the delay it waited.
//
// The claim takes nothing only while the ledger's pause lasts: on a busy machine it
// can come after the pause has ended, and then it takes the rows, which is right. A
// claim that takes anything fails the test unless the database's clock, after the
// claim, had reached the end of the pause that held the rows before it (both read
// on that clock); what it took is handed back, uncharged, for the test's next
// admitDue.
func (b *bundle) untilDue(t *testing.T) time.Duration {
	t.Helper()
	var pausedUntil *time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT min(paused_until) FROM certworker_pauses
WHERE source = 'ledger' AND paused_until > clock_timestamp()`).Scan(&pausedUntil))
	claims, err := b.q.Claim(b.ctx, "test", testDirectory, 100)
	require.NoError(t, err)
	if len(claims) > 0 {
		var now time.Time
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT clock_timestamp()`).Scan(&now))
		if pausedUntil != nil {
			require.False(t, now.Before(*pausedUntil), "a claim took a domain the ledger holds back until %s", pausedUntil)
		}
		for _, c := range claims {
			require.NoError(t, b.q.Release(b.ctx, c, false))
		}
		return 0
	}
	d, ok, err := b.q.NextDue(b.ctx, testDirectory)
	require.NoError(t, err)
	require.True(t, ok, "nothing is scheduled")
	time.Sleep(d)
	return d
}

// admitDue claims what is due and asks the ledger about it under limits.
func (b *bundle) admitDue(t *testing.T, limits issuing.Limits) (admitted []issuing.Claim, refused []queue.Refusal) {
	t.Helper()
	admitted, refused, err := b.q.Admit(b.ctx, testDirectory, limits, b.admissions(t, false))
	require.NoError(t, err)
	return admitted, refused
}

// ledgerTimes are the times of the ledger's rows, oldest first.
func (b *bundle) ledgerTimes(t *testing.T) []time.Time {
	t.Helper()
	return b.times(t, `SELECT at FROM certworker_ledger ORDER BY at, id`)
}

// With --limit-orders-per-account 6/60s (here 6/6s: one token a second), seven names
// verified at once are all ordered: six at once, the seventh when the bucket's next
// token comes, one interval later, not when a window of DURATION has passed. NextDue
// brings the held domain back at that moment.
func TestLedger_SevenNamesAtOnceTheSeventhAtTheNextToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	for i := range 7 {
		b.named(t, tn, fmt.Sprintf("n%d.seven%d.example", i, i))
	}
	limits := issuing.Limits{OrdersPerAccount: issuing.Limit{Count: 6, Window: 6 * time.Second}}
	admitted, refused := b.admitDue(t, limits)
	require.Len(t, admitted, 6)
	require.Len(t, refused, 1)
	require.Contains(t, refused[0].Reason, "a burst of 6, then one every 1s")

	// The account is paused until the next token, a second after the burst, and
	// NextDue wakes the worker then.
	var after float64
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT extract(epoch FROM p.paused_until - (SELECT min(at) FROM certworker_ledger)) FROM certworker_pauses p
WHERE p.scope = 'ca' AND p.source = 'ledger'`).Scan(&after))
	require.InDelta(t, 1.0, after, 0.005, "the account's pause does not end at the next token")
	require.LessOrEqual(t, b.untilDue(t), time.Second, "the held domain is not due at the next token")
	admitted, refused = b.admitDue(t, limits)
	require.Len(t, admitted, 1, "the seventh was not ordered at the next token")
	require.Empty(t, refused)

	at := b.ledgerTimes(t)
	require.Len(t, at, 7)
	require.Less(t, at[5].Sub(at[0]), 100*time.Millisecond, "the first six were not ordered at once")
	gap := at[6].Sub(at[0])
	require.GreaterOrEqual(t, gap, time.Second, "the seventh went before the bucket had a token")
	// That the seventh waited for the next token and not for a window is held above,
	// on the database's clock: the pause ends one interval after the burst, NextDue
	// brings the domain back then, and the admission asked for then admits it. How
	// soon after its token the test asked is the machine's (0.5 s late beside a CPU
	// hog), so the gap itself is not bounded above.
}

// A drain longer than DURATION keeps the CA's pace, also when the ledger's rows are
// pruned as it goes: the buckets' state is not derived from them. Limit 3/1.5s: three
// at once, then one every 0.5 s, for eight names (2.5 s, past the window).
//
// The pace is held on the database's clock, by the bucket's own arithmetic, not by
// how soon the test asks: each order takes its token no earlier than the bucket
// holds it; the account's bucket moves one interval on per order (from the order's
// time if the bucket had refilled by then), so that an order taken late does not
// delay the next; and an admission asked for once the bucket holds a token admits an
// order. A busy machine asks late (an order went 0.5 s after its token, beside a CPU
// hog), which delays that order, and no other.
func TestLedger_ADrainLongerThanTheWindowKeepsThePaceAfterPruning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	for i := range 8 {
		b.named(t, tn, fmt.Sprintf("n%d.drain%d.example", i, i))
	}
	l := issuing.Limit{Count: 3, Window: 1500 * time.Millisecond}
	limits := issuing.Limits{OrdersPerAccount: l}
	var at []time.Time
	var tat time.Time // the bucket's, as its arithmetic has it (zero: full)
	holds := func() time.Time { return tat.Add(-l.Window + l.Interval()) }
	for len(at) < 8 {
		var asked time.Time
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT clock_timestamp()`).Scan(&asked))
		admitted, _ := b.admitDue(t, limits)
		for _, c := range admitted {
			require.NoError(t, b.q.SettleLedger(b.ctx, testDirectory, c.Token, issuing.LedgerIssued, limits))
		}
		if !tat.IsZero() && !asked.Before(holds()) {
			require.NotEmpty(t, admitted, "asked at %s with a token in the bucket since %s, and nothing admitted",
				asked.Format("15:04:05.000000"), holds().Format("15:04:05.000000"))
		}
		for _, a := range b.ledgerTimes(t) {
			if !tat.IsZero() {
				require.False(t, a.Before(holds()), "order %d went at %s, before its token at %s",
					len(at), a.Format("15:04:05.000000"), holds().Format("15:04:05.000000"))
			}
			if tat.Before(a) {
				tat = a
			}
			tat = tat.Add(l.Interval())
			at = append(at, a)
		}
		var stored time.Time
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT tat FROM certworker_buckets WHERE kind = 'account' AND key = $1`,
			testDirectory).Scan(&stored))
		require.WithinDuration(t, tat, stored, time.Millisecond, "the account's bucket after %d orders", len(at))
		// What pruning removes: every row (the most any pruning can).
		b.exec(t, `DELETE FROM certworker_ledger`)
		if len(at) < 8 {
			b.untilDue(t)
		}
	}
	require.Len(t, at, 8)
	require.Less(t, at[2].Sub(at[0]), 100*time.Millisecond, "the burst was not taken at once")
	t.Logf("orders after the burst at %v", func() (d []time.Duration) {
		for _, a := range at[3:] {
			d = append(d, a.Sub(at[0]).Round(time.Millisecond))
		}
		return d
	}())
}

// Each kind of bucket refills one token every DURATION/COUNT: an empty bucket holds
// the order back, pauses its key until the next token (and no longer), and lets it go
// once the token is there.
func TestLedger_EachBucketRefillsOneTokenAnInterval(t *testing.T) {
	t.Parallel()
	// One token every 3 s: the bucket, spent by the test, stays empty for 3 s, in
	// which the test's first admission must come (beside a CPU hog, it came more than
	// the 1 s of a 2/2s limit after the spend, and found the token back).
	l := issuing.Limit{Count: 2, Window: 6 * time.Second}
	for _, tc := range []struct {
		kind, key string
		limits    issuing.Limits
		scope     string
		flag      string
	}{
		{"account", testDirectory, issuing.Limits{OrdersPerAccount: l}, issuing.ScopeCA, "--limit-orders-per-account"},
		{"registered_domain", "refill.example", issuing.Limits{CertsPerRegisteredDomain: l}, issuing.ScopeRegisteredDomain, "--limit-certs-per-registered-domain"},
		{"exact_set", "a.refill.example", issuing.Limits{CertsPerExactSet: l}, issuing.ScopeDomain, "--limit-certs-per-exact-set"},
		{"failed_authz", "a.refill.example", issuing.Limits{FailedAuthzPerName: l}, issuing.ScopeDomain, "--limit-failed-authz-per-name"},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			id := b.named(t, b.tenant(t), "a.refill.example")
			b.spentBucket(t, testDirectory, tc.kind, tc.key, l, 2)
			var asked, holds time.Time
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT clock_timestamp(), tat - make_interval(secs => $3)
FROM certworker_buckets WHERE kind = $1 AND key = $2`, tc.kind, tc.key, (l.Window-l.Interval()).Seconds()).Scan(&asked, &holds))
			require.True(t, asked.Before(holds), "the test asked after the bucket's token was back: the machine was too slow for the test")
			admitted, refused := b.admitDue(t, tc.limits)
			require.Empty(t, admitted, "an order went with its bucket empty")
			require.Len(t, refused, 1)
			require.Contains(t, refused[0].Reason, tc.flag)
			// The bucket is empty until tat − DURATION + interval: 3 s before tat.
			var before float64
			require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT extract(epoch FROM b.tat - p.paused_until) FROM certworker_pauses p, certworker_buckets b
WHERE p.scope = $1 AND p.key = $2 AND p.source = 'ledger' AND b.kind = $3 AND b.key = $2`,
				tc.scope, tc.key, tc.kind).Scan(&before))
			require.InDelta(t, (l.Window - l.Interval()).Seconds(), before, 0.001, "the pause does not end at the next token")

			b.untilDue(t)
			admitted, refused = b.admitDue(t, tc.limits)
			require.Empty(t, refused, "the refilled token was not there")
			require.Len(t, admitted, 1)
			require.Equal(t, id, admitted[0].ID)
		})
	}
}

// A failed authorization takes a token of its name's bucket (SettleLedger), and the
// last one pauses the name until the next; an order that fails gives back the
// certificate tokens it took, and one never sent the account's too.
func TestSettleLedger_SpendsAndRefundsTokensAsTheCACounts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	b.named(t, tn, "a.settle.example")
	one := issuing.Limit{Count: 1, Window: time.Hour}
	limits := issuing.Limits{OrdersPerAccount: one, CertsPerRegisteredDomain: one, CertsPerExactSet: one, FailedAuthzPerName: one}
	admitted, _ := b.admitDue(t, limits)
	require.Len(t, admitted, 1)
	tat := func(kind string) *time.Time {
		var at *time.Time
		err := b.pool.QueryRow(b.ctx, `SELECT max(tat) FROM certworker_buckets WHERE kind = $1`, kind).Scan(&at)
		require.NoError(t, err)
		return at
	}
	require.NotNil(t, tat("account"))
	require.NotNil(t, tat("exact_set"))
	require.Nil(t, tat("failed_authz"), "an order took a failed authorization's token before it failed")

	require.NoError(t, b.q.SettleLedger(b.ctx, testDirectory, admitted[0].Token, issuing.LedgerFailedAuthz, limits))
	var now time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT now()`).Scan(&now))
	require.WithinDuration(t, now, *tat("exact_set"), time.Second, "a failed order kept its certificate token")
	require.WithinDuration(t, now, *tat("registered_domain"), time.Second)
	require.WithinDuration(t, now.Add(time.Hour), *tat("account"), time.Second, "an order the CA saw gave its token back")
	require.WithinDuration(t, now.Add(time.Hour), *tat("failed_authz"), time.Second)
	var left float64
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT extract(epoch FROM paused_until - now()) FROM certworker_pauses
WHERE scope = 'domain' AND key = 'a.settle.example' AND source = 'ledger'`).Scan(&left))
	require.InDelta(t, time.Hour.Seconds(), left, 5, "the name's last failed authorization did not pause it until the next token")
}

// The tenant reserve with buckets, at L = 10 and 25 %: R = ⌈2.5⌉ = 3, where ⌈⌉ and
// ⌊⌋ differ. A tenant alone takes L − R = 7 at once; one that took exactly R in the
// last DURATION is held while the bucket holds R, while a newcomer tenant is not;
// one that took R − 1 is not held even at fewer tokens than R.
func TestTenantReserve_WithBucketsAtTenOf25Percent(t *testing.T) {
	t.Parallel()
	limits := issuing.Limits{OrdersPerAccount: issuing.Limit{Count: 10, Window: 100 * time.Second}, TenantReserve: 0.25}

	t.Run("a tenant alone takes L-R at once", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tn := b.tenant(t)
		for i := range 12 {
			b.named(t, tn, fmt.Sprintf("n%d.alone%d.example", i, i))
		}
		admitted, refused := b.admitDue(t, limits)
		require.Len(t, admitted, 7, "a tenant alone took %d of a bucket of 10 with R = 3", len(admitted))
		require.Len(t, refused, 5)
		require.Contains(t, refused[0].Reason, "--limit-tenant-reserve 25%")
		// Held until the bucket holds R + 1 = 4: one interval (10 s) from now.
		var left float64
		require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT extract(epoch FROM paused_until - now()) FROM certworker_pauses WHERE scope = 'tenant' AND key = $1`, tn).Scan(&left))
		require.InDelta(t, 10, left, 0.5)
	})

	for _, tc := range []struct {
		name       string
		own, taken int // the tenant's orders in the last DURATION; tokens taken from the bucket
		held       bool
	}{
		{"exactly R with R left is held", 3, 7, true},
		{"exactly R with R+1 left is not held", 3, 6, false},
		{"R-1 with R-1 left is not held", 2, 8, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			busy, newcomer := b.tenant(t), b.tenant(t)
			b.exec(t, `
INSERT INTO certworker_ledger (directory, name, registered_domain, tenant_id)
SELECT $1, 'old' || g || '.example', 'old' || g || '.example', $2::uuid FROM generate_series(1, $3) g`,
				testDirectory, busy, tc.own)
			b.spentBucket(t, testDirectory, "account", testDirectory, limits.OrdersPerAccount, tc.taken)
			b.named(t, busy, "a.busy.example")
			admitted, refused := b.admitDue(t, limits)
			require.Equal(t, tc.held, len(admitted) == 0, "the busy tenant: %v", refused)
			// A newcomer takes a token all the same.
			b.named(t, newcomer, "a.newcomer.example")
			admitted, refused = b.admitDue(t, limits)
			require.Len(t, admitted, 1, "the newcomer tenant was held back: %v", refused)
			require.Equal(t, "a.newcomer.example", admitted[0].Domain)
		})
	}
}

// --limit-consecutive-failures 3: after two failed authorizations in a row (COUNT − 1)
// the name is no longer ordered at the CA. Without a second CA the domain fails, not
// charged, with a reason the tenant can act on; a retry does not reset the count (the
// next claim stops it again), a success does.
func TestLedger_ConsecutiveFailuresStopTheNameOneShortOfTheCAsPause(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.named(t, b.tenant(t), "a.failing.example")
	limits := issuing.Limits{ConsecutiveFailures: issuing.ConsecutiveFailures(3)}
	for range 2 {
		admitted, refused := b.admitDue(t, limits)
		require.Empty(t, refused)
		require.Len(t, admitted, 1)
		require.NoError(t, b.q.SettleLedger(b.ctx, testDirectory, admitted[0].Token, issuing.LedgerFailedAuthz, limits))
		require.NoError(t, b.q.Release(b.ctx, admitted[0], true))
	}
	admitted, refused := b.admitDue(t, limits)
	require.Empty(t, admitted, "a name was ordered at COUNT - 1 failures in a row")
	require.Len(t, refused, 1)
	require.True(t, refused[0].Stopped)
	require.False(t, refused[0].Rerouted)
	row := b.sslRow(t, id)
	require.Equal(t, "failed", row.Status)
	require.Zero(t, row.Attempts, "the stop was charged")
	require.Regexp(t, `^too many failures: a\.failing\.example failed validation 2 times in a row`, *row.Error)

	// The proxy's retry does not reset the count.
	b.exec(t, `SELECT certworker_queue_for_issuance(id, tenant_id) FROM proxy_domains WHERE id = $1`, id)
	admitted, refused = b.admitDue(t, limits)
	require.Empty(t, admitted, "a retry reset the failures in a row")
	require.Len(t, refused, 1)
	require.Equal(t, "failed", b.status(t, id))

	// A success does: one failure forgiven (a day), then the order issues.
	b.exec(t, `SELECT certworker_queue_for_issuance(id, tenant_id) FROM proxy_domains WHERE id = $1`, id)
	b.exec(t, `UPDATE certworker_buckets SET tat = tat - interval '1 day' WHERE kind = 'consecutive_failures'`)
	admitted, _ = b.admitDue(t, limits)
	require.Len(t, admitted, 1, "a failure forgiven a day later did not let the name go")
	require.NoError(t, b.q.SettleLedger(b.ctx, testDirectory, admitted[0].Token, issuing.LedgerIssued, limits))
	require.Empty(t, b.strings(t, `SELECT key FROM certworker_buckets WHERE kind = 'consecutive_failures'`),
		"a success did not reset the failures in a row")
}

// With a second CA, a name stopped for its failures in a row at one CA goes to the
// other (recorded as that CA's refusal, for the routed claim); one stopped at both
// fails.
func TestLedger_ConsecutiveFailuresSendTheNameToTheSecondCA(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.named(t, b.tenant(t), "a.failing.example")
	limits := issuing.Limits{ConsecutiveFailures: issuing.ConsecutiveFailures(3)}
	b.spentBucket(t, testDirectory, "consecutive_failures", "a.failing.example", limits.ConsecutiveFailures, 2)
	b.spentBucket(t, secondDirectory, "consecutive_failures", "a.failing.example", limits.ConsecutiveFailures, 2)
	routed := b.routed(time.Hour)
	ask := func(directory string) []queue.Refusal {
		claims := b.claimAll(t, routed)
		require.Len(t, claims, 1)
		c := claims[id]
		require.Equal(t, directory, c.Directory)
		admitted, refused, err := routed.Admit(b.ctx, directory, limits, []queue.Admission{{Claim: c,
			Name: "a.failing.example", RegisteredDomain: "failing.example"}})
		require.NoError(t, err)
		require.Empty(t, admitted)
		return refused
	}
	refused := ask(testDirectory)
	require.Len(t, refused, 1)
	require.True(t, refused[0].Rerouted, "the name was not sent to the second CA")
	require.Equal(t, "pending", b.status(t, id))
	var refusedBy, refusedCause string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ssl_ca_refused, ssl_ca_refused_cause FROM proxy_domains WHERE id = $1`, id).
		Scan(&refusedBy, &refusedCause))
	require.Equal(t, testDirectory, refusedBy)
	require.Equal(t, issuing.RefusedTooManyFailures, refusedCause)

	refused = ask(secondDirectory)
	require.Len(t, refused, 1)
	require.False(t, refused[0].Rerouted, "stopped at both CAs, the name went back to the first")
	require.Equal(t, "failed", b.status(t, id))
}

// A row held out of line under a pause that ended after the claim that held it (a
// ledger's pause ends at the bucket's next token) is due at once: NextDue does not
// leave it to the poll.
func TestNextDue_ARowHeldUnderAPauseThatEndedIsDueNow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.named(t, b.tenant(t), "a.held.example")
	b.exec(t, `
INSERT INTO certworker_pauses (directory, scope, key, source, paused_until, reason, held_since)
VALUES ($1, 'ca', $1, 'ledger', now() - interval '10 milliseconds', 'ledger: test', now())`, testDirectory)
	b.exec(t, `UPDATE proxy_domains SET ssl_held = 'ca:' || $2 WHERE id = $1`, id, testDirectory)
	d, ok, err := b.q.NextDue(b.ctx, testDirectory)
	require.NoError(t, err)
	require.True(t, ok, "a held row whose pause ended is not scheduled")
	require.LessOrEqual(t, d, time.Duration(0))
}

// A name whose order failed its validation and which is claimed again before that
// order is settled finds its certificate token still taken, and is paused until the
// next token (a week for certificates per exact set). The settle gives the token
// back, and must lift that pause with it, as it does for any other failure: left, it
// held a name whose first order failed under load for the whole week.
func TestSettleLedger_AFailedAuthorizationLiftsTheCertificatePauseOfAClaimThatRaced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.named(t, b.tenant(t), "raced.example")
	limits := issuing.Limits{CertsPerExactSet: issuing.Limit{Count: 1, Window: 7 * 24 * time.Hour}}
	as := b.admissions(t, false)
	require.Len(t, as, 1)
	admitted, _, err := b.q.Admit(b.ctx, testDirectory, limits, as)
	require.NoError(t, err)
	require.Len(t, admitted, 1)
	// The same name admitted again while its order is in flight (the retry's claim,
	// before the settle): no token left.
	_, refused, err := b.q.Admit(b.ctx, testDirectory, limits, as)
	require.NoError(t, err)
	require.Len(t, refused, 1)
	paused := func() int {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT count(*) FROM certworker_pauses WHERE scope = 'domain' AND key = 'raced.example' AND source = 'ledger' AND paused_until > now()`).Scan(&n))
		return n
	}
	require.Equal(t, 1, paused())
	require.NoError(t, b.q.SettleLedger(b.ctx, testDirectory, admitted[0].Token, issuing.LedgerFailedAuthz, limits))
	require.Zero(t, paused(), "the certificate token came back, and the pause for it stayed")
}
