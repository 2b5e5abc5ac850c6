package e2e

import (
	"testing"
	"time"

	"github.com/go-acme/lego/v4/certificate"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// profileWorker starts a worker whose retries and replacements are not held back by
// minutes of backoff, and which passes every second.
func (w *world) profileWorker(t *testing.T, name string, profile string) *workertest.Instance {
	t.Helper()
	acfg := w.acmeConfig()
	acfg.Profile = profile
	qcfg := issuing.DefaultConfig()
	qcfg.RetryBase = time.Second
	return w.startWorker(t, name, acfg, worker.Config{Queue: qcfg, Concurrency: 2, PollInterval: time.Second})
}

// setProfile is the tenant's call, certworker_set_profile; it must be accepted.
func (w *world) setProfile(t *testing.T, id string, profile *string) {
	t.Helper()
	d, err := queue.New(w.pool, issuing.DefaultConfig()).SetProfile(w.ctx, id, w.tenant, profile)
	require.NoError(t, err)
	require.NotNil(t, d, "the tenant's own domain and a profile name: not refused")
}

// waitIssued waits for the domain's certificate, the orders-th order of its name, and
// returns that order.
func (w *world) waitIssued(t *testing.T, id, name string, orders int) pebbletest.Order {
	t.Helper()
	waitFor(t, 30*time.Second, "the certificate", func() bool {
		return len(ordersFor(w.ca, name)) == orders && w.domain(t, id).Status == "active" && w.certProfile(t, name) != nil
	})
	return ordersFor(w.ca, name)[orders-1]
}

func (w *world) certProfile(t *testing.T, name string) *string {
	t.Helper()
	var p *string
	require.NoError(t, w.pool.QueryRow(w.ctx, `SELECT profile FROM proxy_certificates WHERE domain = $1`, name).Scan(&p))
	return p
}

// certID is the RFC 9773 id of the domain's stored certificate: what a renewal of it
// names in "replaces".
func (w *world) certID(t *testing.T, name string) string {
	t.Helper()
	var chain string
	require.NoError(t, w.pool.QueryRow(w.ctx, `SELECT certificate_pem FROM proxy_certificates WHERE domain = $1`, name).Scan(&chain))
	leaf, err := issuing.LeafFromPEM(chain)
	require.NoError(t, err)
	id, err := certificate.MakeARICertID(leaf)
	require.NoError(t, err)
	return id
}

// renewNow makes the domain's certificate due, as time would.
func (w *world) renewNow(t *testing.T, name string) {
	t.Helper()
	_, err := w.pool.Exec(w.ctx, `UPDATE proxy_certificates SET renew_at = now() WHERE domain = $1`, name)
	require.NoError(t, err)
}

// passes waits until the instance has made n more passes on its poll.
func passes(t *testing.T, in *workertest.Instance, n int) {
	t.Helper()
	in.WaitForLog(t, "wake-up", in.Logs.FilterMessage("wake-up").Len()+n, 30*time.Second)
}

func ptr(s string) *string { return &s }

// A domain without a certificate whose profile the CA's directory does not list fails
// at once, with nothing sent to the CA and ssl_error naming the profile and those the
// CA offers; it stays failed, pass after pass, until the tenant sets another profile,
// which queues it, and its certificate records the profile. Guards against an order
// the CA must refuse, ten charged attempts for a tenant's setting, and a refusal
// retried on every pass.
func TestE2E_AProfileTheCADoesNotOfferFailsAFirstIssuanceAtOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	in := w.profileWorker(t, "w", pebbletest.DefaultProfile)
	name := randomName("bogus")
	var id string
	require.NoError(t, w.pool.QueryRow(w.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_method, verification_token, ssl_provider)
VALUES ($1, $2, 'http', 'e2e-token', 'acme') RETURNING id::text`, w.tenant, name).Scan(&id))
	w.setProfile(t, id, ptr("bogus"))
	_, err := w.pool.Exec(w.ctx, `UPDATE proxy_domains SET verification_status = 'verified' WHERE id = $1`, id)
	require.NoError(t, err)

	waitFor(t, 20*time.Second, "the domain to fail", func() bool { return w.domain(t, id).Status == "failed" })
	passes(t, in, 3)
	d := w.domain(t, id)
	require.Equal(t, "failed", d.Status)
	require.Equal(t, 1, d.Attempts)
	require.Equal(t, `profile: the CA does not offer profile "bogus"; it offers alternate, default; no certificate is ordered until the domain's ssl_profile names a profile the CA offers`, *d.Error)
	require.Zero(t, w.ca.OrderRequests(), "nothing is sent to the CA")
	require.Zero(t, w.ca.NewAccounts(), "nothing is sent to the CA")

	w.setProfile(t, id, ptr(pebbletest.AltProfile))
	o := w.waitIssued(t, id, name, 1)
	require.Equal(t, pebbletest.AltProfile, o.Profile)
	require.Equal(t, pebbletest.AltProfile, *w.certProfile(t, name))
	require.Nil(t, w.domain(t, id).Error)
	require.Equal(t, 1, in.Logs.FilterMessage("the CA does not offer the domain's profile; marked failed until the tenant sets another").Len())
}

// A tenant who picks another profile for an active domain gets a certificate of that
// profile at once, ordered as a replacement ("replaces" names the
// certificate it replaces), and renewals keep the profile. Guards against a setting
// that waits for the next renewal (up to two months), a replacement ordered as a new
// certificate (no renewal exemption at the CA), a renewal that falls back to
// --acme-profile, and a replacement repeated once done.
func TestE2E_AChangedProfileReplacesTheCertificateAndRenewalsKeepIt(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	in := w.profileWorker(t, "w", pebbletest.DefaultProfile)
	name := randomName("change")
	id := w.addDomains(t, name)[0]
	first := w.waitIssued(t, id, name, 1)
	require.Equal(t, pebbletest.DefaultProfile, first.Profile)
	require.Equal(t, pebbletest.DefaultProfile, *w.certProfile(t, name))

	replaced := w.certID(t, name)
	w.setProfile(t, id, ptr(pebbletest.AltProfile))
	second := w.waitIssued(t, id, name, 2)
	waitFor(t, 10*time.Second, "the replacement stored", func() bool { return *w.certProfile(t, name) == pebbletest.AltProfile })
	require.Equal(t, pebbletest.AltProfile, second.Profile)
	require.Equal(t, replaced, second.Replaces)

	passes(t, in, 3)
	require.Len(t, ordersFor(w.ca, name), 2, "a replacement done is not ordered again")

	renewed := w.certID(t, name)
	w.renewNow(t, name)
	third := w.waitIssued(t, id, name, 3)
	require.Equal(t, pebbletest.AltProfile, third.Profile, "the renewal keeps the domain's profile")
	require.Equal(t, renewed, third.Replaces)
}

// An active domain whose new profile the CA does not offer keeps its certificate: no
// replacement is ordered, ssl_error names the profile and those offered, and at its
// renewal it is renewed under its certificate's profile, still saying so. The same
// when the directory lists the profile but the CA answers invalidProfile. Guards
// against a tenant's setting costing them their certificate, a refused replacement
// tried on every pass, and a refused profile asked for again at each renewal.
func TestE2E_ARefusedProfileKeepsTheCertificateAndRenewsUnderItsOwn(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, profile, note string
		refuse              bool
	}{
		{"not in the directory", "bogus",
			`profile: the CA does not offer profile "bogus"; it offers alternate, default; the domain keeps its certificate, renewed under profile "default", until its ssl_profile names a profile the CA offers`,
			false},
		{"invalidProfile", pebbletest.AltProfile,
			`profile: the CA refused profile "alternate" (invalidProfile: profile name "alternate" not recognized); it offers alternate, default; the domain keeps its certificate, renewed under profile "default", until its ssl_profile names a profile the CA offers`,
			true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, pebbletest.Options{})
			front := pebbletest.NewFront(t, w.ca)
			acfg := w.acmeConfig()
			acfg.DirectoryURL = front.DirectoryURL
			qcfg := issuing.DefaultConfig()
			qcfg.RetryBase = time.Second
			in := w.startWorker(t, "w", acfg, worker.Config{Queue: qcfg, Concurrency: 1, PollInterval: time.Second})
			name := randomName("refused")
			id := w.addDomains(t, name)[0]
			w.waitIssued(t, id, name, 1)
			refused := 0
			if tc.refuse {
				// Once: the rule cannot tell the profiles apart, and the renewal
				// under the certificate's must reach the CA.
				front.Add(pebbletest.Rule{Step: pebbletest.StepNewOrder, Names: []string{name}, Times: 1,
					Answer: pebbletest.InvalidProfile(tc.profile)})
				refused = 1
			}

			w.setProfile(t, id, ptr(tc.profile))
			waitFor(t, 20*time.Second, "the refusal in ssl_error", func() bool {
				d := w.domain(t, id)
				return d.Error != nil && *d.Error == tc.note
			})
			passes(t, in, 3)
			require.Equal(t, "active", w.domain(t, id).Status)
			require.Len(t, ordersFor(w.ca, name), 1, "no replacement is ordered")
			require.Equal(t, refused, front.Answered()[pebbletest.StepNewOrder])

			renewed := w.certID(t, name)
			w.renewNow(t, name)
			second := w.waitIssued(t, id, name, 2)
			waitFor(t, 10*time.Second, "the renewal stored", func() bool { return w.certID(t, name) != renewed })
			require.Equal(t, pebbletest.DefaultProfile, second.Profile, "renewed under the certificate's profile")
			require.Equal(t, renewed, second.Replaces)
			d := w.domain(t, id)
			require.Equal(t, "active", d.Status)
			require.Equal(t, tc.note, *d.Error, "the tenant is still told")
			require.Equal(t, refused, front.Answered()[pebbletest.StepNewOrder], "the refused profile is not asked for at the renewal")
			require.Equal(t, 1, in.Logs.FilterMessage("the CA does not offer the domain's profile; it keeps its certificate").Len())
		})
	}
}

// A CA that does not offer --acme-profile (one that could not be asked at start, or
// that dropped the profile since) is the operator's to fix: the order is handed back
// uncharged, nothing reaches the CA, and the instance stops claiming and reports why.
// Guards against every domain of the fleet charged, and failed, for a flag.
func TestE2E_ACAThatDoesNotOfferTheFlagsProfileHaltsTheInstance(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	in := w.profileWorker(t, "w", "gone")
	name := randomName("halt")
	id := w.addDomains(t, name)[0]
	waitFor(t, 20*time.Second, "the instance to stop claiming", func() bool { return in.Halted() != nil })
	var halt *worker.ProfileHalt
	require.ErrorAs(t, in.Halted(), &halt)
	require.Equal(t, `--acme-profile: the CA does not offer profile "gone"; it offers alternate, default; stopped claiming until restarted with a profile the CA offers`,
		in.Halted().Error())
	waitFor(t, 10*time.Second, "the hand-back", func() bool { return w.domain(t, id).Status == "pending" })
	d := w.domain(t, id)
	require.Zero(t, d.Attempts, "not charged")
	require.Nil(t, d.Error)
	require.Zero(t, w.ca.OrderRequests())
}

// A changed --acme-profile applies to a domain without a profile of its own at its next
// renewal, not at once: the fleet is not reissued in one go when the operator changes
// the flag, and its renewals then record the new profile. Guards against a flag change
// that replaces every certificate at once (the CA's limits, a burst of orders), and
// against a certificate recorded under the profile it was not issued under.
func TestE2E_AChangedAcmeProfileAppliesAtTheNextRenewal(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	first := w.profileWorker(t, "first", pebbletest.DefaultProfile)
	name := randomName("flag")
	id := w.addDomains(t, name)[0]
	w.waitIssued(t, id, name, 1)
	require.Equal(t, pebbletest.DefaultProfile, *w.certProfile(t, name))
	require.NoError(t, first.Stop(t, 30*time.Second))

	second := w.profileWorker(t, "second", pebbletest.AltProfile)
	passes(t, second, 3)
	require.Len(t, ordersFor(w.ca, name), 1, "a changed --acme-profile replaces nothing at once")

	renewed := w.certID(t, name)
	w.renewNow(t, name)
	o := w.waitIssued(t, id, name, 2)
	waitFor(t, 10*time.Second, "the renewal stored", func() bool { return w.certID(t, name) != renewed })
	require.Equal(t, pebbletest.AltProfile, o.Profile)
	require.Equal(t, renewed, o.Replaces)
	require.Equal(t, pebbletest.AltProfile, *w.certProfile(t, name))
}
