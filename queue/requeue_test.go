package queue_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// The tenant operations are SQL functions that the proxy calls; these tests call
// them as the proxy does, in plain SQL.

// returned is what a tenant operation returned: the domain's row as it now is.
type returned struct {
	ID, Status, Provider, Method string
	Attempts                     int
	Error                        *string
	LastAttempt                  *time.Time
}

func (b *bundle) callTenantOp(t *testing.T, sql string, args ...any) []returned {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT id::text, ssl_status, ssl_provider, verification_method,
    ssl_attempts, ssl_error, ssl_last_attempt_at FROM `+sql, args...)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (returned, error) {
		var d returned
		err := r.Scan(&d.ID, &d.Status, &d.Provider, &d.Method, &d.Attempts, &d.Error, &d.LastAttempt)
		return d, err
	})
	require.NoError(t, err)
	return out
}

func (b *bundle) queueForIssuance(t *testing.T, id, tenant string) []returned {
	t.Helper()
	return b.callTenantOp(t, `certworker_queue_for_issuance($1, $2)`, id, tenant)
}

func (b *bundle) updateDomain(t *testing.T, id, tenant string, method, provider *string) []returned {
	t.Helper()
	return b.callTenantOp(t, `certworker_update_domain($1, $2, $3, $4)`, id, tenant, method, provider)
}

func strPtr(s string) *string { return &s }

func TestQueueForIssuanceSQL_RequeuesAFailedDomainAndClearsItsHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	id, _ := b.domain(t, tn, "failed", 10, ago(60))
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_error = 'something' WHERE id = $1`, id)
	require.NoError(t, err)

	var got []returned
	wakes := b.notifications(t, func() { got = b.queueForIssuance(t, id, tn) })
	require.Len(t, got, 1, "retry should find the domain")
	require.Equal(t, id, got[0].ID)
	require.Equal(t, "pending", got[0].Status)
	require.Zero(t, got[0].Attempts)
	require.Nil(t, got[0].Error)
	// Cleared, so the next pass picks it up now rather than waiting out a backoff
	// computed for a cause the operator has just fixed.
	require.Nil(t, got[0].LastAttempt)
	require.Equal(t, 1, wakes, "a retried domain must wake the workers")
	require.True(t, b.claimsInclude(t, id), "a retried domain must be claimable straight away")
}

// A domain backing off is in the claimable set already, so the trigger says nothing
// when it is requeued: the function must wake the workers itself, or the domain waits
// for the next poll.
func TestQueueForIssuanceSQL_RequeuesABackingOffDomainAndWakesTheWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	id, _ := b.domain(t, tn, "pending", 3, ago(5))
	var got []returned
	wakes := b.notifications(t, func() { got = b.queueForIssuance(t, id, tn) })
	require.Len(t, got, 1)
	require.Zero(t, got[0].Attempts)
	require.Equal(t, 1, wakes)
	require.True(t, b.claimsInclude(t, id))
}

// Each refusal returns no row and changes nothing. Queueing an unverified domain would
// order a certificate for a name nobody has proved control of; a manual one is not
// ACME's; another tenant's is not the caller's; an active domain is renewed on its own
// schedule (requeueing it orders a certificate it does not need), and one being
// issued has an order running (requeueing it orders the same domain twice).
func TestQueueForIssuanceSQL_RefusesWhatItMustNotQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	owner, stranger := b.tenant(t), b.tenant(t)
	failedOfOwner, _ := b.domain(t, owner, "failed", 10, ago(60))
	active, _ := b.domain(t, owner, "active", 0, ago(60))
	provisioning, _ := b.domain(t, owner, "provisioning", 0, ago(5))
	for _, tc := range []struct {
		name, id, tenant string
	}{
		{"not verified", b.insert(t, owner, "pending", "pending", "acme"), owner},
		{"manual", b.insert(t, owner, "verified", "pending", "manual"), owner},
		{"another tenant's", failedOfOwner, stranger},
		{"active", active, owner},
		{"provisioning", provisioning, owner},
	} {
		before := b.sslRow(t, tc.id)
		require.Empty(t, b.queueForIssuance(t, tc.id, tc.tenant), "queued a domain that is %s", tc.name)
		require.Equal(t, before, b.sslRow(t, tc.id), "a refused domain (%s) was modified", tc.name)
	}
}

// Otherwise the domain would sit in whatever state the old provider left it in, and
// nothing would ever pick it up.
func TestUpdateDomainSQL_SwitchingAVerifiedDomainToAcmeQueuesIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	var id string
	require.NoError(t, b.pool.QueryRow(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token,
    ssl_status, ssl_provider, ssl_attempts, ssl_error)
VALUES ($1, 'switch.example', 'verified', 'tok', 'active', 'manual', 4, 'old') RETURNING id::text`, tn).Scan(&id))
	var got []returned
	wakes := b.notifications(t, func() { got = b.updateDomain(t, id, tn, nil, strPtr("acme")) })
	require.Len(t, got, 1, "domain should be found")
	require.Equal(t, "pending", got[0].Status, "switching to acme must queue the domain")
	require.Equal(t, "acme", got[0].Provider)
	require.Zero(t, got[0].Attempts, "history not cleared")
	require.Nil(t, got[0].Error)
	require.Equal(t, 1, wakes)
	require.True(t, b.claimsInclude(t, id), "a domain switched to acme must become claimable")
}

func TestUpdateDomainSQL_SwitchingAnUnverifiedDomainToAcmeDoesNotQueueIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	id := b.insert(t, tn, "pending", "pending", "manual")
	require.Len(t, b.updateDomain(t, id, tn, nil, strPtr("acme")), 1)
	require.False(t, b.claimsInclude(t, id), "an unverified domain must not become claimable by changing its provider")
}

// Only the verification method: the provider, and everything the provider clause
// would have reset, must be untouched.
func TestUpdateDomainSQL_LeavesAbsentFieldsAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	id, _ := b.domain(t, tn, "pending", 3, ago(10))
	got := b.updateDomain(t, id, tn, strPtr("http"), nil)
	require.Len(t, got, 1)
	require.Equal(t, "http", got[0].Method)
	require.Equal(t, "acme", got[0].Provider)
	require.Equal(t, 3, got[0].Attempts, "an unrelated update reset the attempt count")
	require.NotNil(t, got[0].LastAttempt)
	// The same provider is no change either.
	got = b.updateDomain(t, id, tn, nil, strPtr("acme"))
	require.Equal(t, 3, got[0].Attempts, "setting the same provider reset the attempt count")
}

func TestUpdateDomainSQL_WillNotCrossATenantBoundary(t *testing.T) {
	t.Parallel()
	b := setup(t)
	owner, stranger := b.tenant(t), b.tenant(t)
	id, _ := b.domain(t, owner, "pending", 0, nil)
	before := b.sslRow(t, id)
	require.Empty(t, b.updateDomain(t, id, stranger, strPtr("http"), strPtr("none")), "update crossed a tenant boundary")
	require.Equal(t, before, b.sslRow(t, id))
	var method string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT verification_method FROM proxy_domains WHERE id = $1`, id).Scan(&method))
	require.Equal(t, "dns", method, "another tenant's domain was modified")
}

// A domain switched away from acme while its certificate is being ordered loses the
// claim with it: the order's result is not stored (only while the
// domain is still acme), and the row is not left 'provisioning' for a worker that will
// never finish it.
func TestUpdateDomainSQL_SwitchingAwayFromAcmeDropsTheClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	id, name := b.domain(t, tn, "pending", 0, nil)
	c := b.claimOne(t, id)
	got := b.updateDomain(t, id, tn, nil, strPtr("manual"))
	require.Len(t, got, 1)
	require.Equal(t, "pending", got[0].Status)
	r := b.sslRow(t, id)
	require.Nil(t, r.Token)
	require.Nil(t, r.Lease)
	err := b.markActive(c, mintCertificate(t, name, nowSecond(), nowSecond().Add(90*day)))
	require.ErrorIs(t, err, issuing.ErrNotACME, "the result's refusal says why: the switch")
	require.Empty(t, b.certRows(t, name), "the result of an order for a domain no longer acme was stored")
}

// A value outside the contract's sets is the constraint's error, and changes nothing.
func TestUpdateDomainSQL_RefusesAValueOutsideTheSet(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	id, _ := b.domain(t, tn, "pending", 0, nil)
	_, err := b.pool.Exec(b.ctx, `SELECT * FROM certworker_update_domain($1, $2, NULL, 'letsencrypt')`, id, tn)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23514", pgErr.Code)
}

// The functions return proxy_domains rows: a column the proxy or a later migration
// adds to the table must not break them.
func TestTenantOperations_SurviveAColumnAddedToTheTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	id, _ := b.domain(t, tn, "failed", 10, ago(60))
	require.Len(t, b.queueForIssuance(t, id, tn), 1)
	_, err := b.pool.Exec(b.ctx, `ALTER TABLE proxy_domains ADD COLUMN notes text`)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_status = 'failed' WHERE id = $1`, id)
	require.NoError(t, err)
	require.Len(t, b.queueForIssuance(t, id, tn), 1)
	require.Len(t, b.updateDomain(t, id, tn, strPtr("http"), nil), 1)
}

// The Go methods are thin calls to the functions.
func TestQueueForIssuanceAndUpdateDomain_CallTheSQLFunctions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	owner, stranger := b.tenant(t), b.tenant(t)
	id, _ := b.domain(t, owner, "failed", 10, ago(60))
	ok, err := b.q.QueueForIssuance(b.ctx, id, stranger)
	require.NoError(t, err)
	require.False(t, ok)
	ok, err = b.q.QueueForIssuance(b.ctx, id, owner)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "pending", b.status(t, id))

	d, err := b.q.UpdateDomain(b.ctx, id, stranger, nil, strPtr("none"))
	require.NoError(t, err)
	require.Nil(t, d)
	d, err = b.q.UpdateDomain(b.ctx, id, owner, strPtr("http"), nil)
	require.NoError(t, err)
	require.NotNil(t, d)
	require.Equal(t, id, d.ID)
	require.Equal(t, owner, d.TenantID)
	require.Equal(t, "http", d.VerificationMethod)
	require.Equal(t, "acme", d.SSLProvider)
}

// The operator's `certworker retry DOMAIN`: each refusal names its reason, and a
// backing-off domain is put back at once.
func TestRetry_RefusesWhatItCannotRequeue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	_, active := b.domain(t, tn, "active", 0, nil)
	_, provisioning := b.domain(t, tn, "provisioning", 0, ago(5))
	for _, tc := range []struct{ domain, reason string }{
		{"unknown.example", "unknown domain"},
		{b.domainName(t, b.insert(t, tn, "pending", "failed", "acme")), "not verified"},
		{b.domainName(t, b.insert(t, tn, "verified", "failed", "manual")), "does not come from ACME"},
		{active, "already active"},
		{provisioning, "being issued"},
	} {
		err := b.q.Retry(b.ctx, tc.domain)
		var refused *queue.RefusedError
		require.ErrorAs(t, err, &refused, tc.domain)
		require.Contains(t, refused.Reason, tc.reason)
	}
	backingOff, n := b.domain(t, tn, "pending", 3, ago(5))
	require.NoError(t, b.q.Retry(b.ctx, strings.ToUpper(n)), "the name is looked up in any case")
	require.True(t, b.claimsInclude(t, backingOff), "a retried domain must be claimable at once")
}

// Two rows that differ only in case, neither verified and acme (neither keeps the
// name) and neither spelled as typed: retry and status refuse to choose, naming both,
// rather than act on whichever the database returns first.
func TestRetryAndState_RefuseANameTwoDomainsHoldInDifferentCases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	lower := b.unverified(t, tn, "twice.example")
	upper := b.unverified(t, tn, "Twice.Example")
	for _, call := range []func() error{
		func() error { return b.q.Retry(b.ctx, "TWICE.example") },
		func() error { _, err := b.q.State(b.ctx, "twice.EXAMPLE"); return err },
	} {
		err := call()
		var amb *queue.AmbiguousError
		require.ErrorAs(t, err, &amb)
		require.ElementsMatch(t, []queue.NameMatch{{ID: lower, Domain: "twice.example"}, {ID: upper, Domain: "Twice.Example"}}, amb.Matches)
		require.Contains(t, err.Error(), lower)
		require.Contains(t, err.Error(), upper)
	}
	require.Equal(t, "pending", b.status(t, lower), "an ambiguous retry changed a row")
	require.Equal(t, "pending", b.status(t, upper), "an ambiguous retry changed a row")
}
