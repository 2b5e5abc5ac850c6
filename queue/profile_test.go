package queue_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
)

// issued is an active domain whose certificate the worker stored under certProfile
// ("": none recorded), and whose own ssl_profile is then set to profile (nil: NULL).
func (b *bundle) issued(t *testing.T, tenant string, certProfile string, profile *string) (string, string) {
	t.Helper()
	name := "p-" + uuid.NewString()[:8] + ".example"
	id := b.named(t, tenant, name)
	c := b.claimOne(t, id)
	cert := mintCertificate(t, name, nowSecond().Add(-time.Hour), nowSecond().Add(90*24*time.Hour))
	cert.Profile = certProfile
	require.NoError(t, b.markActive(c, cert))
	b.setProfileQuietly(t, id, profile)
	return id, name
}

// setProfileQuietly writes a domain's ssl_profile with the triggers off, as a row
// written without certworker_set_profile (or set while its order was running) holds
// it: the profile's trigger would queue the replacement at once, which is what the
// housekeeping's own tests must find left to do.
func (b *bundle) setProfileQuietly(t *testing.T, id string, profile *string) {
	t.Helper()
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		_, err := tx.Exec(b.ctx, `UPDATE proxy_domains SET ssl_profile = $2 WHERE id = $1`, id, profile)
		return err
	}))
}

// profileRow is what the tests read of a domain's profile state.
type profileRow struct {
	Status, Error, Profile, Refused, CertProfile *string
	Attempts                                     int
}

func (b *bundle) profileRow(t *testing.T, id string) profileRow {
	t.Helper()
	var r profileRow
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT d.ssl_status, d.ssl_error, d.ssl_profile, d.ssl_profile_refused, c.profile, d.ssl_attempts
FROM proxy_domains d LEFT JOIN proxy_certificates c ON c.domain = d.domain WHERE d.id = $1`, id).
		Scan(&r.Status, &r.Error, &r.Profile, &r.Refused, &r.CertProfile, &r.Attempts))
	return r
}

func ptr(s string) *string { return &s }

// certworker_set_profile sets the tenant's own domain's profile, NULL puts it back on
// --acme-profile, and anything else changes nothing and returns no row: another
// tenant's domain, and values that are not profile names (the tenant controls them,
// and they end up in orders, logs and ssl_error). Guards against one tenant setting
// another's profile, and against "" being taken for "the CA's default".
func TestSetProfile_SetsTheTenantsOwnDomainAndRefusesTheRest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant, other := b.tenant(t), b.tenant(t)
	id := b.named(t, tenant, "set-"+uuid.NewString()[:8]+".example")

	d, err := b.q.SetProfile(b.ctx, id, tenant, ptr("shortlived"))
	require.NoError(t, err)
	require.NotNil(t, d)
	require.Equal(t, "shortlived", *d.SSLProfile)

	for _, refused := range []struct {
		name, tenant string
		profile      *string
	}{
		{"another tenant's domain", other, ptr("classic")},
		{"empty", tenant, ptr("")},
		{"a space", tenant, ptr("short lived")},
		{"leading dash", tenant, ptr("-classic")},
		{"65 characters", tenant, ptr(strings.Repeat("a", 65))},
		{"a newline", tenant, ptr("classic\n")},
		{"not ASCII", tenant, ptr("clássic")},
		{"a quote", tenant, ptr(`x"y`)},
	} {
		d, err := b.q.SetProfile(b.ctx, id, refused.tenant, refused.profile)
		require.NoError(t, err, refused.name)
		require.Nil(t, d, refused.name)
		require.Equal(t, "shortlived", *b.profileRow(t, id).Profile, refused.name)
	}

	d, err = b.q.SetProfile(b.ctx, id, tenant, ptr(strings.Repeat("a", 64)))
	require.NoError(t, err)
	require.NotNil(t, d, "64 characters is a name")
	d, err = b.q.SetProfile(b.ctx, id, tenant, nil)
	require.NoError(t, err)
	require.NotNil(t, d)
	require.Nil(t, d.SSLProfile)
	require.Nil(t, b.profileRow(t, id).Profile)
}

// Setting a profile is asking again: a domain that failed because the CA does not
// offer its profile is queued (pending, history cleared), and an active one loses the
// refusal and its note, and is queued to ask the CA again. Guards against a tenant who fixes the profile and still
// waits for an operator's retry, and against a stale note on an active domain.
func TestSetProfile_ClearsARefusalAndQueuesTheDomainItFailed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	failed, _ := b.domain(t, tenant, "failed", 1, ago(10))
	active, _ := b.issued(t, tenant, "classic", ptr("bogus"))
	_, err := b.pool.Exec(b.ctx, `
UPDATE proxy_domains SET ssl_profile = 'bogus', ssl_profile_refused = 'bogus', ssl_error = 'profile: the CA does not offer profile "bogus"'
WHERE id = ANY($1::uuid[])`, []string{failed, active})
	require.NoError(t, err)

	_, err = b.q.SetProfile(b.ctx, failed, tenant, ptr("classic"))
	require.NoError(t, err)
	r := b.profileRow(t, failed)
	require.Equal(t, "pending", *r.Status)
	require.Zero(t, r.Attempts)
	require.Nil(t, r.Error)
	require.Nil(t, r.Refused)
	require.True(t, b.claimsInclude(t, failed), "the domain must be claimable at once")

	_, err = b.q.SetProfile(b.ctx, active, tenant, ptr("bogus"))
	require.NoError(t, err)
	r = b.profileRow(t, active)
	require.Equal(t, "pending", *r.Status, "setting the same profile again asks the CA again")
	require.Nil(t, r.Error)
	require.Nil(t, r.Refused)
}

// A tenant who sets another profile than its certificate's gets the certificate
// replaced at once: the domain is queued (claimable now, history cleared), and the
// claim names the certificate to replace; nothing is queued for the same profile, a
// certificate with no recorded profile, a return to --acme-profile (NULL: it applies at
// the next renewal), or a certificate the proxy does not want renewed. Guards against
// a setting that waits for the next renewal, and against one that replaces what it
// should not.
func TestSetProfile_QueuesTheReplacementOfACertificateOfAnotherProfile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	changed, _ := b.issued(t, tenant, "classic", nil)
	same, _ := b.issued(t, tenant, "classic", nil)
	unrecorded, _ := b.issued(t, tenant, "", nil)
	reset, _ := b.issued(t, tenant, "classic", ptr("classic"))
	noRenew, noRenewName := b.issued(t, tenant, "classic", nil)
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_certificates SET auto_renew = false WHERE domain = $1`, noRenewName)
	require.NoError(t, err)

	for id, profile := range map[string]*string{changed: ptr("shortlived"), same: ptr("classic"),
		unrecorded: ptr("shortlived"), reset: nil, noRenew: ptr("shortlived")} {
		d, err := b.q.SetProfile(b.ctx, id, tenant, profile)
		require.NoError(t, err)
		require.NotNil(t, d)
	}
	r := b.profileRow(t, changed)
	require.Equal(t, "pending", *r.Status)
	require.Zero(t, r.Attempts)
	for _, id := range []string{same, unrecorded, reset, noRenew} {
		require.Equal(t, "active", b.status(t, id))
	}
	c := b.claimOne(t, changed)
	require.Equal(t, "shortlived", *c.Profile)
	require.Equal(t, "classic", c.CertProfile)
	require.NotEmpty(t, c.CurrentPEM, "the replacement names the certificate it replaces")
}

// The housekeeping replaces a certificate issued under another profile than the one its
// domain now names when the profile was written without certworker_set_profile, and
// only then. Guards against migrate (every certificate without
// a recorded profile) replacing the whole fleet, against a changed --acme-profile
// (ssl_profile NULL) replacing everything at once instead of at each renewal, and
// against a profile the CA refused being tried on every pass.
func TestRequeueProfileChanges_ReplacesOnlyACertificateOfAnotherProfile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	changed, _ := b.issued(t, tenant, "classic", ptr("shortlived"))
	same, _ := b.issued(t, tenant, "classic", ptr("classic"))
	fleet, _ := b.issued(t, tenant, "classic", nil)
	unrecorded, _ := b.issued(t, tenant, "", ptr("shortlived"))
	refused, _ := b.issued(t, tenant, "classic", ptr("bogus"))
	noRenew, noRenewName := b.issued(t, tenant, "classic", ptr("shortlived"))
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_profile_refused = 'bogus' WHERE id = $1`, refused)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_certificates SET auto_renew = false WHERE domain = $1`, noRenewName)
	require.NoError(t, err)

	n, err := b.q.RequeueProfileChanges(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, "pending", b.status(t, changed))
	for _, id := range []string{same, fleet, unrecorded, refused, noRenew} {
		require.Equal(t, "active", b.status(t, id))
	}

	c := b.claimOne(t, changed)
	require.Equal(t, "shortlived", *c.Profile)
	require.Equal(t, "classic", c.CertProfile)
	require.NotEmpty(t, c.CurrentPEM, "the replacement names the certificate it replaces")

	n, err = b.q.RequeueProfileChanges(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a domain being replaced is not requeued again")
}

// A certificate uploaded by hand was not issued under anything certworker knows: its
// recorded profile goes with the old certificate. Guards against an upload being
// overwritten because the profile of the certificate it replaced differs.
func TestCertificateReplacedByHand_ForgetsTheProfile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	id, name := b.issued(t, tenant, "classic", ptr("shortlived"))
	upload, _ := mintPEM(t, name, nowSecond().Add(-time.Hour), nowSecond().Add(30*24*time.Hour))
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_certificates SET certificate_pem = $2 WHERE domain = $1`, name, upload)
	require.NoError(t, err)
	require.Nil(t, b.profileRow(t, id).CertProfile)
	n, err := b.q.RequeueProfileChanges(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n)
}

// A refused profile ends the claim by what the domain holds: without a certificate it
// fails at once (the attempt counted); with one that is not due it goes back to
// active with the claim dropped and nothing charged; with one due for renewal it stays
// claimed for the renewal under the certificate's profile. The refusal is recorded
// either way. Guards against a domain stuck in provisioning, a refusal retried ten
// times, and a certificate that stops being renewed.
func TestRefuseProfile_FailsWithoutACertificateKeepsOneAndRenewsADueOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	bare := b.named(t, tenant, "bare-"+uuid.NewString()[:8]+".example")
	c := b.claimOne(t, bare)
	renew, err := b.q.RefuseProfile(b.ctx, c, "bogus", "none", "kept")
	require.NoError(t, err)
	require.False(t, renew)
	r := b.profileRow(t, bare)
	require.Equal(t, "failed", *r.Status)
	require.Equal(t, "none", *r.Error)
	require.Equal(t, "bogus", *r.Refused)
	require.Equal(t, 1, r.Attempts)

	kept, _ := b.issued(t, tenant, "classic", ptr("bogus"))
	_, err = b.q.RequeueProfileChanges(b.ctx)
	require.NoError(t, err)
	c = b.claimOne(t, kept)
	renew, err = b.q.RefuseProfile(b.ctx, c, "bogus", "none", "kept")
	require.NoError(t, err)
	require.False(t, renew)
	r = b.profileRow(t, kept)
	require.Equal(t, "active", *r.Status)
	require.Equal(t, "kept", *r.Error)
	require.Equal(t, "bogus", *r.Refused)
	require.Zero(t, r.Attempts)
	var token *string
	var last *time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx,
		`SELECT ssl_claim_token::text, ssl_last_attempt_at FROM proxy_domains WHERE id = $1`, kept).Scan(&token, &last))
	require.Nil(t, token)
	n, err := b.q.RequeueProfileChanges(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a refused profile is not tried again at the next pass")

	due, dueName := b.issued(t, tenant, "classic", ptr("bogus"))
	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_certificates SET renew_at = now() - interval '1 minute' WHERE domain = $1`, dueName)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_last_attempt_at = now() - interval '60 days' WHERE id = $1`, due)
	require.NoError(t, err)
	_, err = b.q.MarkRenewals(b.ctx)
	require.NoError(t, err)
	c = b.claimOne(t, due)
	renew, err = b.q.RefuseProfile(b.ctx, c, "bogus", "none", "kept")
	require.NoError(t, err)
	require.True(t, renew)
	r = b.profileRow(t, due)
	require.Equal(t, "provisioning", *r.Status)
	require.Equal(t, "bogus", *r.Refused)

	// The renewal under the certificate's profile keeps the note and the refusal.
	c.ProfileRefused, c.Notice = "bogus", "kept"
	cert := mintCertificate(t, dueName, nowSecond().Add(-time.Hour), nowSecond().Add(90*24*time.Hour))
	cert.Profile = "classic"
	require.NoError(t, b.markActive(c, cert))
	r = b.profileRow(t, due)
	require.Equal(t, "active", *r.Status)
	require.Equal(t, "kept", *r.Error)
	require.Equal(t, "bogus", *r.Refused)
	require.Equal(t, "classic", *r.CertProfile)
}

// `status` shows the profiles: the domain's own and its certificate's in `status
// DOMAIN`, an active domain renewing under its certificate's profile among the
// domains to look at, and how many domains name each profile.
func TestStatus_ShowsTheProfiles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	id, name := b.issued(t, tenant, "classic", ptr("bogus"))
	b.issued(t, tenant, "classic", ptr("classic"))
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_profile_refused = 'bogus', ssl_error = 'profile: refused' WHERE id = $1`, id)
	require.NoError(t, err)

	s, err := b.q.State(b.ctx, name)
	require.NoError(t, err)
	require.Equal(t, "bogus", *s.Profile)
	require.Equal(t, "bogus", *s.ProfileRefused)
	require.Equal(t, "classic", *s.Certificate.Profile)

	o, err := b.q.Overview(b.ctx)
	require.NoError(t, err)
	require.Equal(t, []queue.ProfileCount{{Profile: "bogus", Domains: 1, Refused: 1}, {Profile: "classic", Domains: 1}}, o.Profiles)
	require.Len(t, o.Domains, 1)
	require.Equal(t, name, o.Domains[0].Domain)
	require.Equal(t, "bogus", *o.Domains[0].Profile)
	require.Equal(t, "classic", *o.Domains[0].CertificateProfile)
}

// A profile written while the domain's order was running (plain UPDATE, the row
// provisioning, so the profile trigger, which acts on active rows, does not fire): the
// certificate issued under the old profile is stored and the domain goes back to
// pending, its replacement under the new profile claimed at once and naming it. Without
// the change the same flow ends active. Guards against a profile set mid-order waiting
// for the housekeeping (up to 10 minutes) to be acted on.
func TestMarkActive_AProfileSetWhileTheOrderRanQueuesItsReplacement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	for _, tc := range []struct {
		name    string
		profile *string
		want    string
	}{
		{"another profile", ptr("shortlived"), "pending"},
		{"the same profile", ptr("classic"), "active"},
		{"no profile of its own", nil, "active"},
	} {
		name := "m-" + uuid.NewString()[:8] + ".example"
		id := b.named(t, tenant, name)
		c := b.claimOne(t, id)
		_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_profile = $2 WHERE id = $1`, id, tc.profile)
		require.NoError(t, err)
		cert := mintCertificate(t, name, nowSecond().Add(-time.Hour), nowSecond().Add(90*24*time.Hour))
		cert.Profile = "classic"
		require.NoError(t, b.markActive(c, cert), tc.name)
		r := b.profileRow(t, id)
		require.Equal(t, tc.want, *r.Status, tc.name)
		require.Zero(t, r.Attempts, tc.name)
		require.Equal(t, "classic", *r.CertProfile, "%s: the certificate is stored whatever comes next", tc.name)
		if tc.want == "pending" {
			next := b.claimOne(t, id)
			require.Equal(t, "shortlived", *next.Profile)
			require.Equal(t, "classic", next.CertProfile)
			require.NotEmpty(t, next.CurrentPEM, "the replacement names the certificate it replaces")
			cert.Profile = "shortlived"
			require.NoError(t, b.markActive(next, cert))
			require.Equal(t, "active", b.status(t, id))
		}
	}
}
