package queue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
)

func TestQueueForIssuance_RequeuesAFailedDomainAndClearsItsHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	id, _ := b.domain(t, tn, "failed", 10, ago(60))
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_error = 'something' WHERE id = $1`, id)
	require.NoError(t, err)

	ok, err := b.q.QueueForIssuance(b.ctx, id, tn)
	require.NoError(t, err)
	require.True(t, ok, "retry should find the domain")

	var status string
	var attempts int
	var sslErr *string
	var last *time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx,
		`SELECT ssl_status, ssl_attempts, ssl_error, ssl_last_attempt_at FROM proxy_domains WHERE id = $1`, id).
		Scan(&status, &attempts, &sslErr, &last))
	require.Equal(t, "pending", status)
	require.Zero(t, attempts)
	require.Nil(t, sslErr)
	// Cleared, so the next pass picks it up now rather than waiting out a backoff
	// computed for a cause the operator has just fixed.
	require.Nil(t, last)
	require.True(t, b.claimsInclude(t, id), "a retried domain must be claimable straight away")
}

// Queueing an unverified domain would have the worker place an order for a name
// nobody has proved control of. The CA would refuse it, but the attempt still spends
// a rate limit.
func TestQueueForIssuance_RefusesADomainThatIsNotVerified(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	id := b.insert(t, tn, "pending", "pending", "acme")
	ok, err := b.q.QueueForIssuance(b.ctx, id, tn)
	require.NoError(t, err)
	require.False(t, ok, "queued an unverified domain")
}

func TestQueueForIssuance_RefusesAManualDomain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	id := b.insert(t, tn, "verified", "pending", "manual")
	ok, err := b.q.QueueForIssuance(b.ctx, id, tn)
	require.NoError(t, err)
	require.False(t, ok, "queued a domain whose certificate does not come from ACME")
}

func TestQueueForIssuance_WillNotTouchAnotherTenantsDomain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	owner, stranger := b.tenant(t), b.tenant(t)
	id, _ := b.domain(t, owner, "failed", 10, ago(60))
	ok, err := b.q.QueueForIssuance(b.ctx, id, stranger)
	require.NoError(t, err)
	require.False(t, ok, "retry crossed a tenant boundary")
	require.Equal(t, "failed", b.status(t, id), "another tenant's domain was modified")
}

// Otherwise the domain would sit in whatever state the old provider left it in, and
// nothing would ever pick it up.
func TestUpdateDomain_SwitchingAVerifiedDomainToAcmeQueuesIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	var id string
	require.NoError(t, b.pool.QueryRow(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token,
    ssl_status, ssl_provider, ssl_attempts, ssl_error)
VALUES ($1, 'switch.example', 'verified', 'tok', 'active', 'manual', 4, 'old') RETURNING id::text`, tn).Scan(&id))
	acme := "acme"
	d, err := b.q.UpdateDomain(b.ctx, id, tn, nil, &acme)
	require.NoError(t, err)
	require.NotNil(t, d, "domain should be found")
	require.Equal(t, "pending", d.SSLStatus, "switching to acme must queue the domain")
	require.Zero(t, d.SSLAttempts, "history not cleared")
	require.Nil(t, d.SSLError)
	require.True(t, b.claimsInclude(t, id), "a domain switched to acme must become claimable")
}

func TestUpdateDomain_SwitchingAnUnverifiedDomainToAcmeDoesNotQueueIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	id := b.insert(t, tn, "pending", "pending", "manual")
	acme := "acme"
	d, err := b.q.UpdateDomain(b.ctx, id, tn, nil, &acme)
	require.NoError(t, err)
	require.NotNil(t, d)
	require.False(t, b.claimsInclude(t, id), "an unverified domain must not become claimable by changing its provider")
}

// Only the verification method: the provider, and everything the provider clause
// would have reset, must be untouched.
func TestUpdateDomain_LeavesAbsentFieldsAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	id, _ := b.domain(t, tn, "pending", 3, ago(10))
	http := "http"
	d, err := b.q.UpdateDomain(b.ctx, id, tn, &http, nil)
	require.NoError(t, err)
	require.NotNil(t, d)
	require.Equal(t, "http", d.VerificationMethod)
	require.Equal(t, "acme", d.SSLProvider)
	require.Equal(t, 3, d.SSLAttempts, "an unrelated update reset the attempt count")
}

func TestUpdateDomain_WillNotCrossATenantBoundary(t *testing.T) {
	t.Parallel()
	b := setup(t)
	owner, stranger := b.tenant(t), b.tenant(t)
	id, _ := b.domain(t, owner, "pending", 0, nil)
	none := "none"
	d, err := b.q.UpdateDomain(b.ctx, id, stranger, nil, &none)
	require.NoError(t, err)
	require.Nil(t, d, "update crossed a tenant boundary")
}

// The operator's `certworker retry DOMAIN`: each refusal names its reason, and a
// backing-off domain is put back at once.
func TestRetry_RefusesWhatItCannotRequeue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	name := func(id string) string {
		var n string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT domain FROM proxy_domains WHERE id = $1`, id).Scan(&n))
		return n
	}
	_, active := b.domain(t, tn, "active", 0, nil)
	_, provisioning := b.domain(t, tn, "provisioning", 0, ago(5))
	for _, tc := range []struct{ domain, reason string }{
		{"unknown.example", "unknown domain"},
		{name(b.insert(t, tn, "pending", "failed", "acme")), "not verified"},
		{name(b.insert(t, tn, "verified", "failed", "manual")), "does not come from ACME"},
		{active, "already active"},
		{provisioning, "being issued"},
	} {
		err := b.q.Retry(b.ctx, tc.domain)
		var refused *queue.RefusedError
		require.ErrorAs(t, err, &refused, tc.domain)
		require.Contains(t, refused.Reason, tc.reason)
	}
	backingOff, n := b.domain(t, tn, "pending", 3, ago(5))
	require.NoError(t, b.q.Retry(b.ctx, n))
	require.True(t, b.claimsInclude(t, backingOff), "a retried domain must be claimable at once")
}
