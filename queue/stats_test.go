package queue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const statsDirectory = "https://ca.example/directory"

// row inserts a domain with the given columns; expiresIn is ssl_expires_at from now
// (nil: none), queuedAgo moves ssl_queued_at back (the trigger stamps it at insert).
type statsRow struct {
	name, verification, status, provider string
	attempts                             int
	expiresIn                            *time.Duration
	queuedAgo                            time.Duration
	// renewAgo, when set, stores a certificate row whose renew_at is that long ago
	// (negative: in the future).
	renewAgo *time.Duration
}

func dur(d time.Duration) *time.Duration { return &d }

func (b *bundle) statsRows(t *testing.T, rows ...statsRow) {
	t.Helper()
	tenant := b.tenant(t)
	for _, r := range rows {
		var expires *float64
		if r.expiresIn != nil {
			s := r.expiresIn.Seconds()
			expires = &s
		}
		_, err := b.pool.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token,
    ssl_status, ssl_provider, ssl_attempts, ssl_expires_at)
VALUES ($1, $2, $3, 'tok', $4, $5, $6, now() + make_interval(secs => $7))`,
			tenant, r.name, r.verification, r.status, r.provider, r.attempts, expires)
		require.NoError(t, err, r.name)
		if r.queuedAgo > 0 {
			_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_queued_at = now() - make_interval(secs => $2) WHERE domain = $1`,
				r.name, r.queuedAgo.Seconds())
			require.NoError(t, err)
		}
		if r.renewAgo != nil {
			_, err = b.pool.Exec(b.ctx, `
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at, renew_at)
SELECT domain, 'pem', 'key', ssl_expires_at, now() - make_interval(secs => $2) FROM proxy_domains WHERE domain = $1`,
				r.name, r.renewAgo.Seconds())
			require.NoError(t, err)
		}
	}
}

// Counts by status, the SLO's two numbers and the next expiry. Guards against counting
// other providers, counting an expired certificate as valid, and an unverified domain
// in the SLO's denominator (the tenant, not certworker, owes it a certificate).
func TestFleetStats_CountsAndSLO(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.statsRows(t,
		statsRow{name: "a1.example", verification: "verified", status: "active", provider: "acme", expiresIn: dur(60 * 24 * time.Hour)},
		statsRow{name: "a2.example", verification: "verified", status: "active", provider: "acme", expiresIn: dur(20 * 24 * time.Hour)},
		statsRow{name: "expired.example", verification: "verified", status: "active", provider: "acme", expiresIn: dur(-time.Hour)},
		statsRow{name: "new.example", verification: "verified", status: "pending", provider: "acme"},
		statsRow{name: "renewing.example", verification: "verified", status: "provisioning", provider: "acme", expiresIn: dur(10 * 24 * time.Hour)},
		statsRow{name: "failed.example", verification: "verified", status: "failed", provider: "acme", attempts: 10},
		statsRow{name: "unverified.example", verification: "pending", status: "pending", provider: "acme"},
		statsRow{name: "manual.example", verification: "verified", status: "active", provider: "manual", expiresIn: dur(time.Hour)},
	)
	s, err := b.q.FleetStats(b.ctx, statsDirectory)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"pending": 2, "provisioning": 1, "active": 3, "failed": 1}, s.Domains)
	require.Equal(t, 6, s.Verified)
	require.Equal(t, 3, s.Valid, "a1, a2 and the renewing one hold a valid certificate")
	require.NotNil(t, s.NextExpiry)
	require.WithinDuration(t, time.Now().Add(10*24*time.Hour), *s.NextExpiry, time.Minute,
		"the earliest expiry among valid certificates (the expired one is not next)")
	require.WithinDuration(t, time.Now(), s.At, time.Minute)
}

// A certificate counts as expiring without renewal only when nothing is renewing it:
// failed, retrying after a failure, or active an hour past its renewal time. Guards
// against alerting on a queued or running renewal, on a short-lived certificate that
// is simply not due yet, and against missing one that no worker has marked.
func TestFleetStats_ExpiringUnrenewed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	day := 24 * time.Hour
	b.statsRows(t,
		// Counted.
		statsRow{name: "failed-2d.example", verification: "verified", status: "failed", provider: "acme", attempts: 10, expiresIn: dur(2 * day)},
		statsRow{name: "retrying-12h.example", verification: "verified", status: "pending", provider: "acme", attempts: 3, expiresIn: dur(12 * time.Hour)},
		statsRow{name: "unmarked-5d.example", verification: "verified", status: "active", provider: "acme", expiresIn: dur(5 * day), renewAgo: dur(2 * time.Hour)},
		// Not counted.
		statsRow{name: "queued-2d.example", verification: "verified", status: "pending", provider: "acme", expiresIn: dur(2 * day)},
		statsRow{name: "running-1h.example", verification: "verified", status: "provisioning", provider: "acme", attempts: 2, expiresIn: dur(time.Hour)},
		statsRow{name: "short-lived.example", verification: "verified", status: "active", provider: "acme", expiresIn: dur(3 * day), renewAgo: dur(-day)},
		statsRow{name: "just-due.example", verification: "verified", status: "active", provider: "acme", expiresIn: dur(2 * day), renewAgo: dur(10 * time.Minute)},
		statsRow{name: "failed-10d.example", verification: "verified", status: "failed", provider: "acme", attempts: 10, expiresIn: dur(10 * day)},
		statsRow{name: "failed-expired.example", verification: "verified", status: "failed", provider: "acme", attempts: 10, expiresIn: dur(-day)},
		statsRow{name: "unverified-failed.example", verification: "failed", status: "failed", provider: "acme", attempts: 10, expiresIn: dur(day / 2)},
		statsRow{name: "manual.example", verification: "verified", status: "failed", provider: "manual", attempts: 10, expiresIn: dur(day / 2)},
	)
	s, err := b.q.FleetStats(b.ctx, statsDirectory)
	require.NoError(t, err)
	// Windows 7, 3, 1 days.
	require.Equal(t, []int{3, 2, 1}, s.ExpiringUnrenewed)
}

// A domain waiting in the queue for more than an hour is counted, from when it
// entered the queue; one waiting for verification is not the queue's.
func TestFleetStats_PendingOverHour(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.statsRows(t,
		statsRow{name: "old.example", verification: "verified", status: "pending", provider: "acme", queuedAgo: 2 * time.Hour},
		statsRow{name: "old-retrying.example", verification: "verified", status: "pending", provider: "acme", attempts: 7, queuedAgo: 70 * time.Minute},
		statsRow{name: "fresh.example", verification: "verified", status: "pending", provider: "acme", queuedAgo: 30 * time.Minute},
		statsRow{name: "new.example", verification: "verified", status: "pending", provider: "acme"},
		statsRow{name: "unverified.example", verification: "pending", status: "pending", provider: "acme", queuedAgo: 5 * time.Hour},
	)
	s, err := b.q.FleetStats(b.ctx, statsDirectory)
	require.NoError(t, err)
	require.Equal(t, 2, s.PendingOverHour)
}

// Queued domains held by a pause in force, by scope, keys matched as the claim matches
// them. Guards against counting another CA's pause, an expired one, a name that
// merely ends with the key's letters, and against missing a name in upper case or
// under a multi-label registered domain.
func TestFleetStats_PausedDomainsByScope(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s, err := b.q.FleetStats(b.ctx, statsDirectory)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"ca": 0, "registered_domain": 0, "domain": 0}, s.Paused)
	require.Nil(t, s.CAPausedUntil)

	b.statsRows(t,
		statsRow{name: "a.example.org", verification: "verified", status: "pending", provider: "acme"},
		statsRow{name: "B.Example.ORG", verification: "verified", status: "pending", provider: "acme"},
		statsRow{name: "shop.example.co.uk", verification: "verified", status: "pending", provider: "acme"},
		statsRow{name: "X.example.net", verification: "verified", status: "pending", provider: "acme"},
		statsRow{name: "y.example.net", verification: "verified", status: "pending", provider: "acme"},
		statsRow{name: "active.example.org", verification: "verified", status: "active", provider: "acme"},
		statsRow{name: "notexample.org", verification: "verified", status: "pending", provider: "acme"},
	)
	_, err = b.pool.Exec(b.ctx, `
INSERT INTO certworker_pauses (scope, key, source, paused_until) VALUES
    ('registered_domain', 'example.org', 'rate_limit', now() + interval '1 hour'),
    ('registered_domain', 'example.co.uk', 'ledger', now() + interval '1 hour'),
    ('registered_domain', 'example.net', 'rate_limit', now() - interval '1 second'),
    ('domain', 'x.example.net', 'rate_limit', now() + interval '1 hour'),
    ('ca', 'https://other-ca.example/dir', 'unreachable', now() + interval '1 hour')`)
	require.NoError(t, err)
	// A second CA's pause of a name holds nothing back at this one.
	_, err = b.pool.Exec(b.ctx, `
INSERT INTO certworker_pauses (directory, scope, key, source, paused_until)
VALUES ('https://other-ca.example/dir', 'registered_domain', 'notexample.org', 'rate_limit', now() + interval '1 hour')`)
	require.NoError(t, err)
	s, err = b.q.FleetStats(b.ctx, statsDirectory)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"ca": 0, "registered_domain": 3, "domain": 1}, s.Paused)
	require.Nil(t, s.CAPausedUntil, "another CA's pause is not this one's")

	_, err = b.pool.Exec(b.ctx, `
INSERT INTO certworker_pauses (scope, key, source, paused_until)
VALUES ('ca', $1, 'rate_limit', now() + interval '30 minutes')`, statsDirectory)
	require.NoError(t, err)
	s, err = b.q.FleetStats(b.ctx, statsDirectory)
	require.NoError(t, err)
	require.Equal(t, 6, s.Paused["ca"], "a CA-wide pause holds every queued domain")
	require.NotNil(t, s.CAPausedUntil)
	require.WithinDuration(t, time.Now().Add(30*time.Minute), *s.CAPausedUntil, time.Minute)
}

// The account-wide budget: orders that reached the CA inside the window, against the
// limit the workers recorded; nothing while the limit is off or unknown.
func TestFleetStats_LedgerBudget(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s, err := b.q.FleetStats(b.ctx, statsDirectory)
	require.NoError(t, err)
	require.Nil(t, s.LedgerLimit, "no worker has recorded the limits")
	require.Nil(t, s.LedgerOrders)

	_, err = b.pool.Exec(b.ctx, `
INSERT INTO certworker_ledger (at, directory, name, registered_domain, outcome) VALUES
    (now() - interval '1 hour', $1, 'a.example', 'a.example', 'issued'),
    (now() - interval '2 hours', $1, 'b.example', 'b.example', 'failed'),
    (now() - interval '1 minute', $1, 'c.example', 'c.example', 'pending'),
    (now() - interval '1 minute', $1, 'd.example', 'd.example', 'not_sent'),
    (now() - interval '4 hours', $1, 'e.example', 'e.example', 'issued'),
    (now() - interval '1 minute', 'https://other-ca.example/dir', 'f.example', 'f.example', 'issued')`, statsDirectory)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `
INSERT INTO certworker_settings (id, limits) VALUES (true,
    '{"orders_per_account": {"count": 300, "window_seconds": 10800}, "certs_per_exact_set": {"count": 5, "window_seconds": 604800}}')
ON CONFLICT (id) DO UPDATE SET limits = EXCLUDED.limits`)
	require.NoError(t, err)
	s, err = b.q.FleetStats(b.ctx, statsDirectory)
	require.NoError(t, err)
	require.NotNil(t, s.LedgerLimit)
	require.Equal(t, 300, *s.LedgerLimit)
	require.Equal(t, 3, *s.LedgerOrders, "three orders reached the CA in the last 3 hours")

	_, err = b.pool.Exec(b.ctx, `UPDATE certworker_settings SET limits = '{"orders_per_account": null}'`)
	require.NoError(t, err)
	s, err = b.q.FleetStats(b.ctx, statsDirectory)
	require.NoError(t, err)
	require.Nil(t, s.LedgerLimit, "the limit is off")
}

// Totals younger than the age allowed are reused, and every other figure is read
// afresh: a domain added since does not move the active and verified counts, a
// certificate that expired since lowers Valid at once, and a status change shows in
// its bucket. Past the age (or with none to reuse) the totals are counted again and
// the figures are exact. Guards against a reuse that freezes the SLO's numerator (an
// expiry must show within a read) and against a count that never comes again.
func TestFleetStats_ReusesTheTotalsWhileYoung(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.statsRows(t,
		statsRow{name: "a1.example", verification: "verified", status: "active", provider: "acme", expiresIn: dur(60 * 24 * time.Hour)},
		statsRow{name: "a2.example", verification: "verified", status: "active", provider: "acme", expiresIn: dur(20 * 24 * time.Hour)},
		statsRow{name: "f1.example", verification: "verified", status: "failed", provider: "acme", attempts: 10},
	)
	first, err := b.q.FleetStatsReusing(b.ctx, statsDirectory, nil, time.Hour)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"pending": 0, "provisioning": 0, "active": 2, "failed": 1}, first.Domains)
	require.Equal(t, 3, first.Verified)
	require.Equal(t, 2, first.Valid)
	require.Equal(t, first.At, first.Totals.At, "counted in the read's snapshot")

	b.statsRows(t, statsRow{name: "a3.example", verification: "verified", status: "active", provider: "acme", expiresIn: dur(30 * 24 * time.Hour)})
	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_expires_at = now() - interval '1 minute' WHERE domain = 'a2.example'`)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_status = 'pending', ssl_attempts = 0 WHERE domain = 'f1.example'`)
	require.NoError(t, err)

	reused, err := b.q.FleetStatsReusing(b.ctx, statsDirectory, &first.Totals, time.Hour)
	require.NoError(t, err)
	require.Equal(t, first.Totals, reused.Totals, "young totals are reused")
	require.Equal(t, map[string]int{"pending": 1, "provisioning": 0, "active": 2, "failed": 0}, reused.Domains,
		"active is the count's; the other statuses are read afresh")
	require.Equal(t, 3, reused.Verified, "the denominator is the count's")
	require.Equal(t, 1, reused.Valid, "the count's verified less those without a valid certificate now (f1 and a2)")
	require.NotNil(t, reused.NextExpiry)
	require.WithinDuration(t, time.Now().Add(30*24*time.Hour), *reused.NextExpiry, time.Minute, "the next expiry is read afresh")

	counted, err := b.q.FleetStatsReusing(b.ctx, statsDirectory, &first.Totals, 0)
	require.NoError(t, err)
	require.True(t, counted.Totals.At.After(first.Totals.At), "old totals are counted again")
	require.Equal(t, map[string]int{"pending": 1, "provisioning": 0, "active": 3, "failed": 0}, counted.Domains)
	require.Equal(t, 4, counted.Verified)
	require.Equal(t, 2, counted.Valid, "a1 and a3")
}
