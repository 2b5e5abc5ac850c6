package queue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func (b *bundle) nextDue(t *testing.T) time.Time {
	t.Helper()
	at, err := b.q.NextDue(b.ctx)
	require.NoError(t, err)
	return at
}

// Nothing scheduled reads as the zero time, which the worker takes as "sleep until
// the poll": any other value would set a timer for a time that means nothing.
func TestNextDue_ZeroForAnEmptyQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.True(t, b.nextDue(t).IsZero())
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
	require.True(t, b.nextDue(t).IsZero(), "scheduled a wake-up at %s for nothing", b.nextDue(t))
}

// A domain never tried is due now: the worker must take it on this pass, not after
// a backoff it has not earned.
func TestNextDue_NowForANeverTriedDomain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.domain(t, b.tenant(t), "pending", 0, nil)
	require.WithinDuration(t, time.Now(), b.nextDue(t), 2*time.Second)
}

// A failed attempt is retried exactly when its backoff runs out, by the same curve
// the claim query applies: the point of the timer is a retry at 2 minutes rather than
// at the next poll, and a timer that fires early finds nothing to claim.
func TestNextDue_TheEndOfABackoff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "pending", 2, ago(30))
	last := b.sslRow(t, id).LastAttempt
	require.NotNil(t, last)
	require.WithinDuration(t, last.Add(b.q.Config().Backoff(2)), b.nextDue(t), time.Second)
}

// An active certificate wakes the worker at its renewal time, so a 6-day certificate
// is renewed at 4 days and not at whatever poll comes after.
func TestNextDue_TheRenewalTimeOfAnActiveCertificate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, name := b.domain(t, b.tenant(t), "active", 0, ago(3600))
	at := time.Now().Add(3 * time.Hour).Truncate(time.Microsecond)
	b.storeCert(t, name, "pem", time.Now().Add(day), &at, true)
	require.WithinDuration(t, at, b.nextDue(t), 0)
}

// A claim's lease expiry is when an order abandoned by a dead instance becomes
// reclaimable: the worker must look then, or the domain waits for a poll.
func TestNextDue_TheLeaseExpiryOfAClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "pending", 0, nil)
	b.claimOne(t, id)
	lease := b.sslRow(t, id).Lease
	require.NotNil(t, lease)
	require.WithinDuration(t, *lease, b.nextDue(t), 0)
}

// With several things scheduled, the earliest wins: a timer set for a later one
// would miss the earlier.
func TestNextDue_TheEarliestOfSeveral(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)

	_, active := b.domain(t, tn, "active", 0, ago(3600))
	renewAt := time.Now().Add(2 * time.Hour).Truncate(time.Microsecond)
	b.storeCert(t, active, "pem", time.Now().Add(day), &renewAt, true)
	require.WithinDuration(t, renewAt, b.nextDue(t), 0)

	// Two failures 30 s ago: due in about 3.5 minutes.
	backingOff, _ := b.domain(t, tn, "pending", 2, ago(30))
	backoffEnd := b.sslRow(t, backingOff).LastAttempt.Add(b.q.Config().Backoff(2))
	require.WithinDuration(t, backoffEnd, b.nextDue(t), time.Second)

	// A claim whose lease runs out in a minute.
	claimed, _ := b.domain(t, tn, "pending", 0, nil)
	b.claimOne(t, claimed)
	lease := *b.sslRow(t, claimed).Lease
	require.WithinDuration(t, lease, b.nextDue(t), 0)

	// And a domain never tried: now.
	b.domain(t, tn, "pending", 0, nil)
	require.WithinDuration(t, time.Now(), b.nextDue(t), 2*time.Second)
}
