package queue_test

import (
	"testing"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

const day = 24 * time.Hour

// storeCert writes a certificate row for domain by hand, as the proxy or an operator
// would: renewAt nil leaves renew_at NULL (an uploaded certificate).
func (b *bundle) storeCert(t *testing.T, domain, chain string, expires time.Time, renewAt *time.Time, autoRenew bool) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at, renew_at, auto_renew)
VALUES ($1, $2, 'key', $3, $4, $5)`, domain, chain, expires, renewAt, autoRenew)
	require.NoError(t, err)
}

// storedRenewAt is the renew_at of domain's certificate row.
func (b *bundle) storedRenewAt(t *testing.T, domain string) *time.Time {
	t.Helper()
	var at *time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx,
		`SELECT renew_at FROM proxy_certificates WHERE domain = $1`, domain).Scan(&at))
	return at
}

func (b *bundle) domainName(t *testing.T, id string) string {
	t.Helper()
	var n string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT domain FROM proxy_domains WHERE id = $1`, id).Scan(&n))
	return n
}

func timePtr(t time.Time) *time.Time { return &t }

// The renewal path end to end: a certificate past its renewal time puts the domain
// back in the queue with a clean slate, wakes the workers, and the claim names the
// certificate being replaced (RFC 9773 "replaces") while the proxy keeps serving it.
func TestMarkRenewals_RequeuesACertificatePastItsRenewalTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t), "active", 0, ago(61*24*3600))
	// A count left on an active row must not make the renewal start part-way up the
	// backoff curve, or near the limit.
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_attempts = 4 WHERE id = $1`, id)
	require.NoError(t, err)
	now := nowSecond()
	chain, _ := mintPEM(t, name, now.Add(-61*day), now.Add(29*day))
	b.storeCert(t, name, chain, now.Add(29*day), timePtr(now.Add(-day)), true)

	var pass issuing.RenewalPass
	wakes := b.notifications(t, func() {
		pass, err = b.q.MarkRenewals(b.ctx)
		require.NoError(t, err)
	})
	require.EqualValues(t, 1, pass.Marked)
	require.Empty(t, pass.Bad)
	require.Equal(t, 1, wakes, "a renewal must wake the workers through the trigger")

	r := b.sslRow(t, id)
	require.Equal(t, "pending", r.Status)
	require.Zero(t, r.Attempts)
	// The domain keeps its certificate until the new one is stored.
	certs := b.certRows(t, name)
	require.Len(t, certs, 1)
	require.Equal(t, chain, certs[0].ChainPEM, "the current certificate was touched before its replacement exists")

	c := b.claimOne(t, id)
	require.Equal(t, chain, c.CurrentPEM, "the renewal order does not know which certificate it replaces")
}

// Each of these has a certificate that is not to be renewed by this worker, or not
// now. Renewing a domain whose tenant turned auto_renew off, or one whose certificate
// the tenant manages, overwrites their certificate; renewing an unverified domain
// orders for a name nobody controls; touching a renewal already under way resets its
// attempts on every poll, so it never backs off and never gives up.
func TestMarkRenewals_LeavesAloneWhatIsNotDue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	now := nowSecond()
	past, future := now.Add(-time.Hour), now.Add(time.Hour)
	type row struct {
		status           string
		attempts         int
		renewAt          time.Time
		autoRenew        bool
		verified, isAcme bool
	}
	for name, r := range map[string]row{
		"renewal time in the future": {status: "active", renewAt: future, autoRenew: true, verified: true, isAcme: true},
		"auto_renew off":             {status: "active", renewAt: past, verified: true, isAcme: true},
		"manual provider":            {status: "active", renewAt: past, autoRenew: true, verified: true},
		"unverified":                 {status: "active", renewAt: past, autoRenew: true, isAcme: true},
		"renewal backing off":        {status: "pending", attempts: 3, renewAt: past, autoRenew: true, verified: true, isAcme: true},
		"renewal being issued":       {status: "provisioning", renewAt: past, autoRenew: true, verified: true, isAcme: true},
		"renewal given up":           {status: "failed", attempts: 10, renewAt: past, autoRenew: true, verified: true, isAcme: true},
	} {
		verification, provider := "failed", "manual"
		if r.verified {
			verification = "verified"
		}
		if r.isAcme {
			provider = "acme"
		}
		id := b.insert(t, tn, verification, r.status, provider)
		_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_attempts = $2, ssl_last_attempt_at = now() - interval '1 hour' WHERE id = $1`, id, r.attempts)
		require.NoError(t, err)
		domain := b.domainName(t, id)
		chain, _ := mintPEM(t, domain, now.Add(-89*day), now.Add(day))
		b.storeCert(t, domain, chain, now.Add(day), timePtr(r.renewAt), r.autoRenew)

		pass, err := b.q.MarkRenewals(b.ctx)
		require.NoError(t, err, name)
		require.Zero(t, pass.Marked, "%s: marked for renewal", name)
		got := b.sslRow(t, id)
		require.Equal(t, r.status, got.Status, name)
		require.Equal(t, r.attempts, got.Attempts, "%s: attempts reset", name)
	}
}

// A certificate uploaded by hand has no renew_at. It is judged by the same rule from
// its own validity as one the worker stores: a third of the lifetime left from 10
// days up, half below (a 6-day certificate renews after 3 days). Left NULL it would
// never be renewed (and the proxy would serve an expired certificate).
func TestMarkRenewals_AHandUploadedCertificateIsJudgedByItsOwnValidity(t *testing.T) {
	t.Parallel()
	now := nowSecond()
	for _, tc := range []struct {
		name      string
		notBefore time.Time
		lifetime  time.Duration
		renewAt   time.Duration // after notBefore
		renewed   bool
	}{
		{"6 days, 3.5 in: past the 3-day mark", now.Add(-day * 7 / 2), 6 * day, 3 * day, true},
		{"6 days, 2.5 in: before the 3-day mark", now.Add(-day * 5 / 2), 6 * day, 3 * day, false},
		{"10 days less a second, 5 in: past its half", now.Add(-5 * day), 10*day - time.Second, 5*day - time.Second/2, true},
		{"10 days, 6 in: before its two thirds", now.Add(-6 * day), 10 * day, 10 * day * 2 / 3, false},
		{"10 days, 7 in: past its two thirds", now.Add(-7 * day), 10 * day, 10 * day * 2 / 3, true},
		{"90 days, 61 in: past the 60-day mark", now.Add(-61 * day), 90 * day, 60 * day, true},
		{"90 days, 59 in: before the 60-day mark", now.Add(-59 * day), 90 * day, 60 * day, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			id, name := b.domain(t, b.tenant(t), "active", 0, ago(3600))
			notAfter := tc.notBefore.Add(tc.lifetime)
			chain, _ := mintPEM(t, name, tc.notBefore, notAfter)
			b.storeCert(t, name, chain, notAfter, nil, true)

			pass, err := b.q.MarkRenewals(b.ctx)
			require.NoError(t, err)
			n := pass.Marked

			at := b.storedRenewAt(t, name)
			require.NotNil(t, at, "no renewal time was recorded for an uploaded certificate")
			require.WithinDuration(t, tc.notBefore.Add(tc.renewAt), *at, time.Second, "renew_at %s", at)
			if tc.renewed {
				require.EqualValues(t, 1, n)
				require.Equal(t, "pending", b.status(t, id))
			} else {
				require.Zero(t, n)
				require.Equal(t, "active", b.status(t, id))
			}
		})
	}
}

// A short-lived certificate with a NULL expires_at renews at half its lifetime, and
// its renewal becomes urgent a fifth of the lifetime before expiry, as any other's:
// the renewal pass works the lifetime out from renew_at and not_before by the rule
// that set them. Worked out as for a 90-day certificate, a 6-day one would be urgent
// only 3.6 days in, and wait behind every first issuance a day too long.
func TestMarkRenewals_AShortLivedCertificateWithoutExpiryIsUrgentAtItsLastFifth(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	now := nowSecond()
	domain := "short-" + uuid.NewString()[:8] + ".example"
	id := b.namedIn(t, tn, domain, "active", 0)
	notBefore := now.Add(-day * 7 / 2)
	chain, _ := mintPEM(t, domain, notBefore, notBefore.Add(6*day))
	b.putCert(t, domain, chain, nil)

	pass, err := b.q.MarkRenewals(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, pass.Marked, "3.5 days into 6: past half the lifetime")
	got := b.queueRow(t, id)
	require.NotNil(t, got.RenewBy)
	require.WithinDuration(t, notBefore.Add(6*day*4/5), *got.RenewBy, time.Millisecond)
	require.NotNil(t, got.Tier)
	require.EqualValues(t, 3, *got.Tier, "not urgent yet: 1.3 days before its last fifth")
}

// The chain is leaf first, and only the leaf's validity counts: an intermediate
// (here one that would be due) must not decide when the domain's certificate renews.
func TestMarkRenewals_AnUploadedChainIsJudgedByItsLeaf(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t), "active", 0, ago(3600))
	now := nowSecond()
	leaf, _ := mintPEM(t, name, now.Add(-day), now.Add(5*day))
	intermediate, _ := mintPEM(t, "intermediate.example", now.Add(-5*day), now.Add(day))
	b.storeCert(t, name, leaf+intermediate, now.Add(5*day), nil, true)

	pass, err := b.q.MarkRenewals(b.ctx)
	require.NoError(t, err)
	require.Zero(t, pass.Marked, "renewed by the intermediate's validity")
	require.Equal(t, "active", b.status(t, id))
	require.WithinDuration(t, now.Add(2*day), *b.storedRenewAt(t, name), 0, "half of the leaf's 6 days")
}

// A certificate just stored is not due until its own renewal time, and after a
// renewal the new certificate's time is the one that counts: a rule of "30 days before
// expiry" would renew a 6-day certificate on every poll, for ever.
func TestMarkRenewals_AJustIssuedShortLivedCertificateIsNotRenewedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t), "pending", 0, nil)
	now := nowSecond()
	first := mintCertificate(t, name, now.Add(-time.Hour), now.Add(-time.Hour+6*day))
	require.NoError(t, b.markActive(b.claimOne(t, id), first))

	for range 3 {
		pass, err := b.q.MarkRenewals(b.ctx)
		require.NoError(t, err)
		require.Zero(t, pass.Marked, "a 6-day certificate was marked for renewal as soon as it was issued")
	}
	require.Equal(t, "active", b.status(t, id))

	// Three days later the renewal is due: as if the clock had moved on.
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_certificates SET renew_at = now() - interval '1 second' WHERE domain = $1`, name)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_last_attempt_at = now() - interval '4 days' WHERE id = $1`, id)
	require.NoError(t, err)
	pass, err := b.q.MarkRenewals(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, pass.Marked)
	c := b.claimOne(t, id)
	require.Equal(t, first.ChainPEM, c.CurrentPEM)

	second := mintCertificate(t, name, now, now.Add(6*day))
	require.NoError(t, b.markActive(c, second))
	for range 3 {
		pass, err := b.q.MarkRenewals(b.ctx)
		require.NoError(t, err)
		require.Zero(t, pass.Marked, "the renewed certificate was renewed again before its new renewal time")
	}
	require.Equal(t, "active", b.status(t, id))
	require.WithinDuration(t, issuing.RenewAtFromValidity(now, now.Add(6*day)), *b.storedRenewAt(t, name), 0)
}

// A certificate replaced by someone else (the proxy, an operator uploading one) is
// renewed on the new certificate's schedule, worked out again from its PEM: keeping
// the old renew_at would let a shorter-lived upload expire before its renewal, or make
// the worker overwrite the upload at once. The worker's own write (MarkActive) sets
// the renewal time with the certificate and keeps it; so does an operator who sets
// renew_at with the upload.
func TestMarkRenewals_ACertificateReplacedBySomeoneElseIsRescheduledFromTheNewOne(t *testing.T) {
	t.Parallel()
	now := nowSecond()
	for _, tc := range []struct {
		name    string
		stale   bool // the old certificate's renewal time has passed
		ownTime bool // the upload sets renew_at itself
	}{
		{"a shorter-lived upload", false, false},
		{"an upload replacing a certificate due for renewal", true, false},
		{"an upload with its own renewal time", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			id, name := b.domain(t, b.tenant(t), "pending", 0, nil)
			require.NoError(t, b.markActive(b.claimOne(t, id), mintCertificate(t, name, now.Add(-time.Hour), now.Add(90*day))))
			if tc.stale {
				_, err := b.pool.Exec(b.ctx, `UPDATE proxy_certificates SET renew_at = now() - interval '1 hour' WHERE domain = $1`, name)
				require.NoError(t, err)
			}
			upload, _ := mintPEM(t, name, now, now.Add(6*day))
			ownRenewAt := now.Add(5 * day)
			if tc.ownTime {
				_, err := b.pool.Exec(b.ctx, `UPDATE proxy_certificates SET certificate_pem = $2, expires_at = $3, renew_at = $4 WHERE domain = $1`,
					name, upload, now.Add(6*day), ownRenewAt)
				require.NoError(t, err)
			} else {
				_, err := b.pool.Exec(b.ctx, `UPDATE proxy_certificates SET certificate_pem = $2, expires_at = $3, updated_at = now() WHERE domain = $1`,
					name, upload, now.Add(6*day))
				require.NoError(t, err)
			}

			pass, err := b.q.MarkRenewals(b.ctx)
			require.NoError(t, err)
			require.Zero(t, pass.Marked, "the upload was renewed at once")
			require.Equal(t, "active", b.status(t, id))
			want := issuing.RenewAtFromValidity(now, now.Add(6*day))
			if tc.ownTime {
				want = ownRenewAt
			}
			require.WithinDuration(t, want, *b.storedRenewAt(t, name), 0)
		})
	}
}
