package queue_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// Counts are of this worker's domains only: a manual or 'none' domain in 'failed' is
// the tenant's business, and counting it would have an operator chase a failure the
// worker cannot have caused and cannot fix.
func TestOverview_CountsAcmeDomainsByStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	for status, n := range map[string]int{"pending": 2, "provisioning": 1, "active": 3, "failed": 4} {
		for range n {
			b.domain(t, tn, status, 0, ago(5))
			b.insert(t, tn, "verified", status, "manual")
			b.insert(t, tn, "verified", status, "none")
		}
	}
	o, err := b.q.Overview(b.ctx)
	require.NoError(t, err)
	require.Equal(t, queue.Counts{Pending: 2, Provisioning: 1, Active: 3, Failed: 4}, o.Counts)
}

// The list is what an operator reads to find out why a domain has no certificate:
// every acme domain that is retrying (pending with a failure behind it) or failed,
// with its error, and when it is next tried. A failed domain waits for `retry`, so
// it has no next attempt; showing one would promise a retry that never comes.
func TestOverview_ListsRetryingAndFailedDomains(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	retrying, retryingName := b.domain(t, tn, "pending", 2, ago(30))
	failed, failedName := b.domain(t, tn, "failed", 10, ago(600))
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_error = 'error of ' || domain WHERE id IN ($1, $2)`, retrying, failed)
	require.NoError(t, err)
	// Not listed: fresh, active, being issued, and another provider's failure.
	b.domain(t, tn, "pending", 0, nil)
	b.domain(t, tn, "active", 0, ago(3600))
	b.domain(t, tn, "provisioning", 0, ago(5))
	b.insert(t, tn, "verified", "failed", "manual")

	o, err := b.q.Overview(b.ctx)
	require.NoError(t, err)
	require.Len(t, o.Domains, 2)

	// Most recent attempt first.
	r, f := o.Domains[0], o.Domains[1]
	require.Equal(t, retrying, r.ID)
	require.Equal(t, retryingName, r.Domain)
	require.Equal(t, "pending", r.SSLStatus)
	require.Equal(t, 2, r.SSLAttempts)
	require.NotNil(t, r.SSLError)
	require.Equal(t, "error of "+retryingName, *r.SSLError)
	require.NotNil(t, r.NextAttempt, "a retrying domain must say when it is next tried")
	last := b.sslRow(t, retrying).LastAttempt
	require.WithinDuration(t, last.Add(b.q.Config().Backoff(2)), *r.NextAttempt, time.Second)

	require.Equal(t, failed, f.ID)
	require.Equal(t, failedName, f.Domain)
	require.Equal(t, "failed", f.SSLStatus)
	require.Equal(t, 10, f.SSLAttempts)
	require.NotNil(t, f.SSLError)
	require.Equal(t, "error of "+failedName, *f.SSLError)
	require.Nil(t, f.NextAttempt, "a failed domain is not retried until someone asks")
}

// A pending row at the attempt limit (left by the Rust worker, or edited by hand) is
// stuck like a failed one: it is listed, with no next attempt.
func TestOverview_APendingDomainAtTheLimitHasNoNextAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "pending", 10, ago(3600))
	o, err := b.q.Overview(b.ctx)
	require.NoError(t, err)
	require.Len(t, o.Domains, 1)
	require.Equal(t, id, o.Domains[0].ID)
	require.Nil(t, o.Domains[0].NextAttempt)
}

// `status --json` is read by scripts: docs/reference.md fixes these key names, an
// empty list is [] (not null, which breaks `jq '.domains[]'`), and next_attempt_at is
// present and null for a failed domain rather than left out.
func TestOverview_MarshalsToTheContractsJSON(t *testing.T) {
	t.Parallel()
	b := setup(t)

	o, err := b.q.Overview(b.ctx)
	require.NoError(t, err)
	raw, err := json.Marshal(o)
	require.NoError(t, err)
	var empty map[string]any
	require.NoError(t, json.Unmarshal(raw, &empty))
	replace, ok := empty["replace"].(map[string]any)
	require.True(t, ok, "replace is not an object: %s", raw)
	require.EqualValues(t, 0, replace["replace_now"])
	require.Equal(t, replace["at"], replace["done_by"], "nothing to replace: done now")
	delete(empty, "replace")
	rest, err := json.Marshal(empty)
	require.NoError(t, err)
	require.JSONEq(t, `{"counts":{"pending":0,"provisioning":0,"active":0,"failed":0},"domains":[],"pauses":[],"profiles":[],"issuers":[]}`, string(rest))

	tn := b.tenant(t)
	b.domain(t, tn, "failed", 10, ago(600))
	b.domain(t, tn, "pending", 1, ago(5))
	o, err = b.q.Overview(b.ctx)
	require.NoError(t, err)
	raw, err = json.Marshal(o)
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(raw, &got))

	counts, ok := got["counts"].(map[string]any)
	require.True(t, ok, "counts is not an object: %s", raw)
	require.ElementsMatch(t, []string{"pending", "provisioning", "active", "failed"}, keys(counts))
	require.EqualValues(t, 1, counts["pending"])
	require.EqualValues(t, 1, counts["failed"])

	domains, ok := got["domains"].([]any)
	require.True(t, ok, "domains is not a list: %s", raw)
	require.Len(t, domains, 2)
	for _, d := range domains {
		d := d.(map[string]any)
		for _, k := range []string{"domain", "ssl_status", "ssl_attempts", "ssl_error", "next_attempt_at"} {
			require.Contains(t, d, k, "key %q missing: %s", k, raw)
		}
		switch d["ssl_status"] {
		case "failed":
			require.Nil(t, d["next_attempt_at"])
		case "pending":
			s, ok := d["next_attempt_at"].(string)
			require.True(t, ok, "next_attempt_at of a retrying domain is %v", d["next_attempt_at"])
			_, err := time.Parse(time.RFC3339Nano, s)
			require.NoError(t, err)
		default:
			t.Fatalf("unexpected ssl_status in %s", raw)
		}
	}
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// `status DOMAIN` answers "which certificate is the proxy serving, and when is it
// renewed": the certificate's issuer, expiry and renewal time, looked up by name in
// any case (operators type names as they see them in a browser).
func TestState_ReturnsTheDomainAndItsCertificate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	id, name := b.domain(t, tn, "pending", 0, nil)
	now := nowSecond()
	cert := mintCertificate(t, name, now.Add(-time.Hour), now.Add(90*day))
	require.NoError(t, b.markActive(b.claimOne(t, id), cert))

	s, err := b.q.State(b.ctx, strings.ToUpper(name))
	require.NoError(t, err)
	require.Equal(t, id, s.ID)
	require.Equal(t, tn, s.TenantID)
	require.Equal(t, name, s.Domain)
	require.Equal(t, "verified", s.VerificationStatus)
	require.Equal(t, "active", s.SSLStatus)
	require.Equal(t, "acme", s.SSLProvider)
	require.Nil(t, s.NextAttempt, "an active domain has no next attempt")
	require.NotNil(t, s.ExpiresAt)
	require.True(t, cert.NotAfter.Equal(*s.ExpiresAt))
	require.NotNil(t, s.Certificate, "the certificate is missing")
	require.NotNil(t, s.Certificate.Issuer)
	require.Equal(t, cert.Issuer, *s.Certificate.Issuer)
	require.Equal(t, cert.Serial, *s.Certificate.Serial)
	require.True(t, cert.NotAfter.Equal(s.Certificate.NotAfter))
	require.NotNil(t, s.Certificate.RenewAt)
	require.True(t, cert.RenewAt.Equal(*s.Certificate.RenewAt))
	require.True(t, s.Certificate.AutoRenew)
}

// A domain without a certificate shows none, and a backing-off one shows when it is
// next tried, by the claim's curve.
func TestState_ADomainWithoutACertificate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t), "pending", 2, ago(30))
	s, err := b.q.State(b.ctx, name)
	require.NoError(t, err)
	require.Nil(t, s.Certificate)
	require.NotNil(t, s.NextAttempt)
	last := b.sslRow(t, id).LastAttempt
	require.WithinDuration(t, last.Add(b.q.Config().Backoff(2)), *s.NextAttempt, time.Second)
}

// An unknown name is ErrNotFound, which the command turns into a clear message and
// exit status, rather than a database error or an empty state.
func TestState_UnknownDomainIsErrNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.q.State(b.ctx, "unknown.example")
	require.ErrorIs(t, err, issuing.ErrNotFound)
}

// `status` says what holds a domain back and until when: a pause of its registered
// domain lists it (it is due, and waits), and its next attempt is the pause's end.
func TestStatus_ShowsWhatPausesADomain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	b.named(t, tn, "a.shop.example")
	b.named(t, tn, "other.example")
	left, err := b.q.Pause(b.ctx, issuing.ScopeRegisteredDomain, "shop.example", issuing.PauseLedger, time.Hour, "ledger: 2 new certificates for shop.example in 168h0m0s")
	require.NoError(t, err)
	until := time.Now().Add(left)

	s, err := b.q.State(b.ctx, "A.Shop.Example")
	require.NoError(t, err)
	require.NotNil(t, s.PausedUntil)
	require.WithinDuration(t, until, *s.PausedUntil, time.Second)
	require.Equal(t, "ledger: 2 new certificates for shop.example in 168h0m0s", *s.PauseReason)
	require.WithinDuration(t, until, *s.NextAttempt, time.Second, "the next attempt is the pause's end")

	o, err := b.q.Overview(b.ctx)
	require.NoError(t, err)
	require.Len(t, o.Domains, 1, "only the held-back domain is listed")
	require.Equal(t, "a.shop.example", o.Domains[0].Domain)
	require.NotNil(t, o.Domains[0].PauseReason)
	require.Len(t, o.Pauses, 1)
	require.Equal(t, "shop.example", o.Pauses[0].Key)

	free, err := b.q.State(b.ctx, "other.example")
	require.NoError(t, err)
	require.Nil(t, free.PausedUntil)
}

// `status` reports next attempts under the running fleet's curve (--retry-base,
// --retry-max, --max-attempts as the workers recorded them), not the defaults: a
// worker with --retry-base 10s retries a domain with two failures 40 s after them,
// not 4 minutes.
func TestStatus_NextAttemptUnderTheFleetsSettings(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t), "pending", 2, ago(0))
	last := b.sslRow(t, id).LastAttempt
	fleet := queue.FleetSettings{RetryBase: 10 * time.Second, RetryMax: time.Hour, MaxAttempts: 3}
	_, _, err := b.q.RecordSettings(b.ctx, fleet)
	require.NoError(t, err)
	s, err := b.q.State(b.ctx, name) // b.q has the default curve
	require.NoError(t, err)
	require.WithinDuration(t, last.Add(40*time.Second), *s.NextAttempt, time.Second)

	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_attempts = 3 WHERE id = $1`, id)
	require.NoError(t, err)
	s, err = b.q.State(b.ctx, name)
	require.NoError(t, err)
	require.Nil(t, s.NextAttempt, "at the fleet's --max-attempts (3) a domain is not tried again")
}

// A certificate stored with a NULL expires_at is shown, with its expiry read from its
// PEM.
func TestState_ACertificateWithANullExpiryIsShownWithItsPEMsExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t), "active", 0, ago(3600))
	now := nowSecond()
	chain, _ := mintPEM(t, name, now.Add(-day), now.Add(89*day))
	b.putCert(t, name, chain, nil)
	s, err := b.q.State(b.ctx, name)
	require.NoError(t, err)
	require.Equal(t, id, s.ID)
	require.NotNil(t, s.Certificate, "the certificate is missing")
	require.True(t, now.Add(89*day).Equal(s.Certificate.NotAfter), "not after %s", s.Certificate.NotAfter)
}

// `status DOMAIN` and `retry DOMAIN` look names up in any case through the index on
// lower(domain), not by reading the whole table (100,000 rows on the proxy's database).
func TestLookUpByName_UsesTheIndexOnLowerDomain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_token)
SELECT $1, 'n' || g || '.example', 'tok' FROM generate_series(1, 20000) g`, tn)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `ANALYZE proxy_domains`)
	require.NoError(t, err)
	rows, err := b.pool.Query(b.ctx, `EXPLAIN SELECT id FROM proxy_domains d WHERE lower(d.domain) = lower('N5.Example')`)
	require.NoError(t, err)
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, strings.Join(plan, "\n"), "proxy_domains_lower_domain_idx")
}
