package queue_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// putCert writes a certificate row by hand, as the Rust worker, the proxy or an
// operator does: renew_at NULL, expires_at as given (nil: NULL, as the Rust worker
// writes when it does not know).
func (b *bundle) putCert(t *testing.T, domain, chain string, expires *time.Time) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at) VALUES ($1, $2, 'key', $3)`,
		domain, chain, expires)
	require.NoError(t, err)
}

// namedIn inserts a verified acme domain with the given name, status and attempts.
func (b *bundle) namedIn(t *testing.T, tenant, name, status string, attempts int) string {
	t.Helper()
	var id string
	require.NoError(t, b.pool.QueryRow(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider, ssl_attempts)
VALUES ($1, $2, 'verified', 'tok', $3, 'acme', $4) RETURNING id::text`, tenant, name, status, attempts).Scan(&id))
	return id
}

// queueRow is what the renewal pass writes on a domain, and what the wake trigger
// derives from it.
type queueRow struct {
	Status   string
	Attempts int
	Error    *string
	RenewBy  *time.Time
	Tier     *int16
}

func (b *bundle) queueRow(t *testing.T, id string) queueRow {
	t.Helper()
	var r queueRow
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT ssl_status, ssl_attempts, ssl_error, ssl_renew_by, ssl_queue_tier FROM proxy_domains WHERE id = $1`, id).
		Scan(&r.Status, &r.Attempts, &r.Error, &r.RenewBy, &r.Tier))
	return r
}

// Odd rows never stop the worker: in one pass, with healthy rows beside them, each odd
// row is dealt with and reported once, and every other row carries on: a NULL
// expires_at (pgx cannot scan NULL into time.Time), a PEM that cannot be read, a
// certificate for another name, two names differing only in case.
func TestMarkRenewals_OddRowsInOnePassWithHealthyOnes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	now := nowSecond()
	suffix := uuid.NewString()[:8]
	name := func(s string) string { return s + "-" + suffix + ".example" }
	// A 90-day certificate: due 60 days in, urgent 72 days in.
	due, notDue := now.Add(-61*day), now.Add(-10*day)
	cert := func(t *testing.T, domain string, notBefore time.Time) string {
		chain, _ := mintPEM(t, domain, notBefore, notBefore.Add(90*day))
		return chain
	}
	type want struct {
		status   string
		attempts int
		errHas   string
		bad      bool
		renewBy  *time.Time // nil: NULL
		tier     int16      // 0: not queued
	}
	urgentAt := func(notBefore time.Time) *time.Time { return timePtr(notBefore.Add(72 * day)) }
	var dupLower, dupUpper string
	rows := []struct {
		name  string
		setup func(t *testing.T) string
		want  want
	}{
		{"healthy, due", func(t *testing.T) string {
			id := b.namedIn(t, tn, name("healthy-due"), "active", 0)
			b.putCert(t, name("healthy-due"), cert(t, name("healthy-due"), due), timePtr(due.Add(90*day)))
			return id
		}, want{status: "pending", renewBy: urgentAt(due), tier: 3}},
		{"healthy, not due", func(t *testing.T) string {
			id := b.namedIn(t, tn, name("healthy-later"), "active", 0)
			b.putCert(t, name("healthy-later"), cert(t, name("healthy-later"), notDue), timePtr(notDue.Add(90*day)))
			return id
		}, want{status: "active"}},
		{"NULL expires_at, due: judged by its PEM", func(t *testing.T) string {
			id := b.namedIn(t, tn, name("null-due"), "active", 0)
			b.putCert(t, name("null-due"), cert(t, name("null-due"), due), nil)
			return id
		}, want{status: "pending", renewBy: urgentAt(due), tier: 3}},
		{"NULL expires_at, not due", func(t *testing.T) string {
			id := b.namedIn(t, tn, name("null-later"), "active", 0)
			b.putCert(t, name("null-later"), cert(t, name("null-later"), notDue), nil)
			return id
		}, want{status: "active"}},
		{"unparsable certificate_pem: due for issuance", func(t *testing.T) string {
			id := b.namedIn(t, tn, name("garbage"), "active", 0)
			b.putCert(t, name("garbage"), "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n", timePtr(now.Add(60*day)))
			return id
		}, want{status: "pending", errHas: "cannot be read", bad: true, tier: 2}},
		{"a certificate for another name: due for issuance", func(t *testing.T) string {
			id := b.namedIn(t, tn, name("misnamed"), "active", 0)
			b.putCert(t, name("misnamed"), cert(t, "elsewhere.example", notDue), timePtr(notDue.Add(90*day)))
			return id
		}, want{status: "pending", errHas: "is for elsewhere.example", bad: true, tier: 2}},
		{"negative attempts, due", func(t *testing.T) string {
			id := b.namedIn(t, tn, name("negative"), "active", -5)
			b.putCert(t, name("negative"), cert(t, name("negative"), due), timePtr(due.Add(90*day)))
			return id
		}, want{status: "pending", renewBy: urgentAt(due), tier: 3}},
		{"huge attempts, due", func(t *testing.T) string {
			id := b.namedIn(t, tn, name("huge"), "active", 2147483647)
			b.putCert(t, name("huge"), cert(t, name("huge"), due), timePtr(due.Add(90*day)))
			return id
		}, want{status: "pending", renewBy: urgentAt(due), tier: 3}},
		{"huge attempts, pending: left to the claim", func(t *testing.T) string {
			return b.namedIn(t, tn, name("huge-pending"), "pending", 2147483647)
		}, want{status: "pending", attempts: 2147483647, tier: 2}},
		{"case duplicate, lower", func(t *testing.T) string {
			dupLower = b.namedIn(t, tn, name("dup"), "pending", 0)
			return dupLower
		}, want{status: "pending", tier: 2}},
		{"case duplicate, upper", func(t *testing.T) string {
			dupUpper = b.namedIn(t, tn, strings.ToUpper(name("dup")), "active", 0)
			return dupUpper
		}, want{status: "failed", errHas: "duplicate domain: ", bad: true}},
		{"healthy pending, never tried", func(t *testing.T) string {
			return b.namedIn(t, tn, name("fresh"), "pending", 0)
		}, want{status: "pending", tier: 2}},
	}
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.setup(t)
	}

	dups, back, err := b.q.MarkCaseDuplicates(b.ctx)
	require.NoError(t, err)
	require.Empty(t, back)
	pass, err := b.q.MarkRenewals(b.ctx)
	require.NoError(t, err, "an odd row stopped the renewal pass")

	bad := map[string]issuing.BadRow{}
	for _, r := range append(dups, pass.Bad...) {
		bad[r.ID] = r
	}
	marked := 0
	for i, r := range rows {
		got := b.queueRow(t, ids[i])
		require.Equal(t, r.want.status, got.Status, r.name)
		require.Equal(t, r.want.attempts, got.Attempts, r.name)
		if r.want.errHas != "" {
			require.NotNil(t, got.Error, r.name)
			require.Contains(t, *got.Error, r.want.errHas, r.name)
		}
		br, isBad := bad[ids[i]]
		require.Equal(t, r.want.bad, isBad, "%s: reported as a bad row", r.name)
		if isBad {
			require.NotEmpty(t, br.Reason, r.name)
			require.Equal(t, b.domainName(t, ids[i]), br.Domain, r.name)
		}
		if r.want.renewBy == nil {
			require.Nil(t, got.RenewBy, r.name)
		} else {
			require.NotNil(t, got.RenewBy, r.name)
			require.WithinDuration(t, *r.want.renewBy, *got.RenewBy, time.Second, r.name)
		}
		if r.want.tier != 0 && r.want.status == "pending" {
			require.NotNil(t, got.Tier, r.name)
			require.Equal(t, r.want.tier, *got.Tier, "%s: the wake trigger's tier", r.name)
		}
		if r.want.status == "pending" && !strings.HasPrefix(r.name, "huge attempts, pending") && !strings.HasPrefix(r.name, "healthy pending") &&
			!strings.HasPrefix(r.name, "case duplicate") {
			marked++
		}
	}
	require.EqualValues(t, marked, pass.Marked)
	require.Len(t, dups, 1, "the twin verified first keeps the name")
	require.NotContains(t, bad[dupUpper].Reason, dupLower, "a twin's error identifies the other row")
	require.NotContains(t, bad[dupUpper].Reason, name("dup"), "a twin's error names the other's spelling")

	claimed := b.drain(t)
	require.Contains(t, claimed, dupLower, "the twin that keeps the name was not ordered")
	require.NotContains(t, claimed, dupUpper, "a case duplicate was ordered")
	require.True(t, slices.Contains(claimed, ids[len(ids)-1]), "the healthy pending domain was not claimed")

	// Once: a second pass reports nothing again.
	dups, back, err = b.q.MarkCaseDuplicates(b.ctx)
	require.NoError(t, err)
	require.Empty(t, dups, "a duplicate was reported twice")
	require.Empty(t, back)
	pass, err = b.q.MarkRenewals(b.ctx)
	require.NoError(t, err)
	require.Empty(t, pass.Bad, "a bad certificate was reported twice")
	require.Zero(t, pass.Marked)
}

// A renewal is urgent from a fifth of its lifetime before expiry, or from the end of
// the CA's renewal window if that comes first: MarkRenewals records which in
// ssl_renew_by, in the statement that requeues the domain, and the wake trigger turns
// it into the row's tier (1: urgent, served before first issuances).
func TestMarkRenewals_ARenewalPastTheCAsWindowIsUrgent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	now := nowSecond()
	notBefore := now.Add(-61 * day)
	domain := fmt.Sprintf("ari-%s.example", uuid.NewString()[:8])
	id := b.namedIn(t, tn, domain, "active", 0)
	chain, _ := mintPEM(t, domain, notBefore, notBefore.Add(90*day))
	b.putCert(t, domain, chain, timePtr(notBefore.Add(90*day)))
	windowEnd := now.Add(-time.Hour)
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_certificates SET ari_window_end = $2 WHERE domain = $1`, domain, windowEnd)
	require.NoError(t, err)

	pass, err := b.q.MarkRenewals(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, pass.Marked)
	got := b.queueRow(t, id)
	require.NotNil(t, got.RenewBy)
	require.WithinDuration(t, windowEnd, *got.RenewBy, time.Millisecond)
	require.NotNil(t, got.Tier)
	require.EqualValues(t, 1, *got.Tier)
}

// The proxy's database after migrate: tens of thousands of certificates without a
// renewal time. One pass gives every one of them its time, not the first thousand
// per pass (which at one pass a poll interval would take an hour at 100,000 rows).
func TestMarkRenewals_SchedulesEveryUnscheduledCertificateInOnePass(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	now := nowSecond()
	chain, _ := mintPEM(t, "*.many.example", now.Add(-10*day), now.Add(80*day))
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
SELECT $1, 'd' || g || '.many.example', 'verified', 'tok', 'active', 'acme' FROM generate_series(1, 2500) g;`, tn)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem)
SELECT 'd' || g || '.many.example', $1, 'key' FROM generate_series(1, 2500) g`, chain)
	require.NoError(t, err)

	pass, err := b.q.MarkRenewals(b.ctx)
	require.NoError(t, err)
	require.Zero(t, pass.Marked)
	require.Empty(t, pass.Bad)
	var unscheduled int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM proxy_certificates WHERE renew_at IS NULL`).Scan(&unscheduled))
	require.Zero(t, unscheduled)
}
