package worker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// validationFailure is an order whose authorization failed at the CA.
type validationFailure struct{}

func (validationFailure) Error() string {
	return "acme: urn:ietf:params:acme:error:unauthorized: invalid response from http://NAME/.well-known/acme-challenge/x: 404"
}
func (validationFailure) AuthorizationFailed() bool { return true }

// A validation failure at the first CA is the domain's, not the CA's: it is charged,
// and retried at the first CA, never at the second.
func TestWorker_AValidationFailureIsNeverRetriedAtTheSecondCA(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t))
	first := fakeissuer.New(10)
	first.Fail = func(string, int) error { return validationFailure{} }
	second := fakeissuer.New(10)
	b.start(t, "w", worker.Config{Issuer: first, Concurrency: 1, PollInterval: time.Second,
		Queue:    issuing.Config{RetryBase: 200 * time.Millisecond, RetryMax: time.Second},
		Fallback: &worker.FallbackCA{Issuer: second, Directory: secondDirectory, After: time.Millisecond}})
	workertest.Eventually(t, 30*time.Second, "three tries at the first CA", func() bool { return first.Count(name) >= 3 })
	require.Zero(t, second.Count(name), "a validation failure moved the domain to the second CA")
	r := b.row(t, id)
	require.GreaterOrEqual(t, r.Attempts, 2, "the validation failures were not charged")
	require.Contains(t, *r.Error, "unauthorized")
}

// A domain without a certificate whose own profile the CA does not offer fails at
// once, charged one attempt, with nothing retried.
func TestWorker_AnUnofferedProfileFailsAFirstIssuanceAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t))
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_profile = 'tlsserver' WHERE id = $1`, id)
	require.NoError(t, err)
	fake := fakeissuer.New(10)
	fake.Fail = func(string, int) error {
		return &issuing.ProfileError{Profile: "tlsserver", Offered: []string{"classic", "shortlived"}}
	}
	b.start(t, "w", worker.Config{Issuer: fake, Concurrency: 1, PollInterval: time.Second,
		Queue: issuing.Config{RetryBase: 100 * time.Millisecond}})
	b.waitStatus(t, id, "failed", 30*time.Second)
	r := b.row(t, id)
	require.Equal(t, 1, r.Attempts)
	require.True(t, strings.HasPrefix(*r.Error, issuing.ProfilePrefix), *r.Error)
	require.Equal(t, 1, fake.Count(name), "the refused profile was ordered again")
}

// Two orders finishing together after the CA's outage log "CA reachable again" once,
// for the one change of state. Both logged it, at the same millisecond: the first to
// delete the outage pause had its answer arrive late, and meanwhile the other found
// no pause but won the instance's flag; each logged for its own reason. Here the
// first delete's answer is held for a second, which makes that order of events
// certain.
func TestWorker_CAReachableAgainIsLoggedOncePerChangeOfState(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	x, _ := b.domain(t, tn)
	y, _ := b.domain(t, tn)
	fake := fakeissuer.New(10)
	fake.Fail = func(_ string, call int) error {
		if call == 1 {
			return &issuing.CAUnavailableError{Err: errors.New("acme: dial tcp: connection refused")}
		}
		return nil
	}
	db := &faultDB{Pool: b.pool}
	db.slowNext("source = 'unreachable'", time.Second)
	in := b.start(t, "w", worker.Config{DB: db, Issuer: fake, Concurrency: 2, PollInterval: time.Second})
	b.waitStatus(t, x, "active", 60*time.Second)
	b.waitStatus(t, y, "active", 10*time.Second)
	// Logged after the CA's answer is recorded, the late one included.
	in.WaitForLog(t, "certificate issued", 2, 10*time.Second)
	require.Equal(t, 0.0, in.Metric(t, "certworker_ca_unreachable"))
	require.Len(t, in.Logs.FilterMessage("CA unreachable; ordering paused for every instance, nothing charged").All(), 1)
	require.Len(t, in.Logs.FilterMessage("CA reachable again; ordering resumes").All(), 1)
}

// A name whose CAA records allowed only the second CA had the first recorded as
// refusing it (for CAA). The tenant changed the records to allow the first: its
// refusal is forgotten, since CAA caused it, and the first CA issues. The domain
// failed at once with "no CA certworker orders from", nothing sent: the claim sent it
// to the second for the first's refusal, and the records now forbade the second.
func TestWorker_ACAARecordThatNowAllowsTheCAOverridesTheRefusalCAACaused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t))
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_ca_refused = $2, ssl_ca_refused_cause = 'caa' WHERE id = $1`,
		id, workertest.Directory)
	require.NoError(t, err)
	first, second := fakeissuer.New(10), fakeissuer.New(10)
	onlyFirst := func(context.Context, string) (issuing.Verdict, string, error) {
		return func(dir string) bool { return dir == workertest.Directory }, "first.example", nil
	}
	b.start(t, "w", worker.Config{Issuer: first, Concurrency: 1, PollInterval: time.Second, CAA: onlyFirst,
		Fallback: &worker.FallbackCA{Issuer: second, Directory: secondDirectory, After: time.Hour}})
	b.waitStatus(t, id, "active", 30*time.Second)
	require.Equal(t, 1, first.Count(name))
	require.Zero(t, second.Count(name))
}

// A renewal admitted as one (exempt from the orders per account), whose order the CA
// refuses for its "replaces" and which is to go again without it, is a new order to
// the CA: the ledger is asked again before it is sent, and with the account's orders
// used up it is held back, uncharged, under the ledger's pause. It was sent as the
// renewal it no longer was, past the limit the ledger exists to keep.
func TestWorker_ARenewalRetriedWithoutReplacesIsAdmittedAgainAsANewOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t))
	fake := fakeissuer.New(10)
	cert, err := fake.Issue(context.Background(), issuing.Request{DomainID: id, Domain: name})
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at) VALUES ($1, $2, 'key', now() + interval '30 days')`,
		name, cert.ChainPEM)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `INSERT INTO certworker_issued_names (directory, name) VALUES ($1, $2)`,
		workertest.Directory, name)
	require.NoError(t, err)
	// The account's one token an hour, taken by another order just now.
	_, err = b.pool.Exec(b.ctx, `
INSERT INTO certworker_buckets (directory, kind, key, tat) VALUES ($1, 'account', $1, now() + interval '1 hour')`,
		workertest.Directory)
	require.NoError(t, err)
	sent := make(chan struct{}, 10)
	withoutReplaces := &readmitting{Issuer: fake, sent: sent}
	limits := issuing.Limits{OrdersPerAccount: issuing.Limit{Count: 1, Window: time.Hour}}
	b.start(t, "w", worker.Config{Issuer: withoutReplaces, Limits: limits, Concurrency: 1, PollInterval: time.Second})
	workertest.Eventually(t, 30*time.Second, "the ledger's pause of the account", func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT count(*) FROM certworker_pauses WHERE scope = 'ca' AND source = 'ledger' AND paused_until > now()`).Scan(&n))
		return n == 1
	})
	b.waitStatus(t, id, "pending", 10*time.Second)
	require.Zero(t, b.row(t, id).Attempts, "the ledger's refusal was charged")
	require.Empty(t, sent, "the order went without replaces past the account's limit")
}

// readmitting is an issuer whose CA refuses every order's "replaces": it asks the
// ledger again (Request.Readmit) and, if let, sends the order without it.
type readmitting struct {
	*fakeissuer.Issuer
	sent chan struct{}
}

func (r *readmitting) Issue(ctx context.Context, req issuing.Request) (*issuing.Certificate, error) {
	if req.CurrentPEM != "" && req.Readmit != nil {
		if err := req.Readmit(ctx); err != nil {
			return nil, err
		}
	}
	r.sent <- struct{}{}
	return r.Issuer.Issue(ctx, req)
}

// authzFailure is a validation the CA says failed (an AuthorizationFailure).
type authzFailure struct{}

func (authzFailure) Error() string {
	return "urn:ietf:params:acme:error:unauthorized: validation failed"
}
func (authzFailure) AuthorizationFailed() bool { return true }

// With --limit-consecutive-failures 3, a name whose validation keeps failing is
// ordered twice (COUNT − 1) and then failed, not charged for the stop, with a reason
// the tenant can act on, well before --max-attempts: the CA never sees the failure
// that would pause the name for the whole account.
func TestWorker_ANameThatKeepsFailingValidationStopsOneShortOfTheCAsPause(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t))
	fake := fakeissuer.New(10)
	fake.Set(func(f *fakeissuer.Issuer) {
		f.Fail = func(string, int) error { return authzFailure{} }
	})
	b.start(t, "w", worker.Config{Issuer: fake, Concurrency: 1, PollInterval: time.Second,
		Limits: issuing.Limits{ConsecutiveFailures: issuing.ConsecutiveFailures(3)},
		Queue:  issuing.Config{RetryBase: 50 * time.Millisecond, RetryMax: 50 * time.Millisecond, MaxAttempts: 10}})
	b.waitStatus(t, id, "failed", 30*time.Second)
	r := b.row(t, id)
	require.Equal(t, 2, fake.Count(name), "the name was not ordered exactly COUNT - 1 times")
	require.Equal(t, 2, r.Attempts, "the stop was charged")
	require.NotNil(t, r.Error)
	require.True(t, strings.HasPrefix(*r.Error, issuing.TooManyFailuresPrefix), *r.Error)
}
