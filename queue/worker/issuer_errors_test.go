package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// pauseLeft is how long the pause of scope, key and source has left, or a negative
// duration when there is none.
func (b *bundle) pauseLeft(t *testing.T, scope, key, source string) time.Duration {
	t.Helper()
	var secs float64
	err := b.pool.QueryRow(b.ctx, `
SELECT COALESCE((SELECT EXTRACT(epoch FROM paused_until - now())::float8 FROM certworker_pauses
                 WHERE scope = $1 AND key = $2 AND source = $3), -1)`, scope, key, source).Scan(&secs)
	require.NoError(t, err)
	return time.Duration(secs * float64(time.Second))
}

// A CA's rate limit is never charged to the domain: the claim is
// handed back (pending, no attempt, no error, not claimed), and what the limit covers
// is paused for every instance until its Retry-After: the whole CA, every name under
// the registered domain, or the one name. What it does not cover carries on. Until
// now only the end-to-end tests, through Pebble, said so.
func TestWorker_ARateLimitIsHandedBackUnchargedAndPausesWhatItCovers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		scope, key       string
		siblingOrdered   bool // y.shop.example, under the same registered domain
		elsewhereOrdered bool // other.example
	}{
		{issuing.ScopeCA, workertest.Directory, false, false},
		{issuing.ScopeRegisteredDomain, "shop.example", false, true},
		{issuing.ScopeDomain, "x.shop.example", true, true},
	} {
		t.Run(tc.scope, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			fake := fakeissuer.New(10)
			fake.Fail = func(domain string, _ int) error {
				if domain == "x.shop.example" {
					return &issuing.RateLimitError{RetryAfter: time.Hour, Detail: "too many certificates", Scope: tc.scope}
				}
				return nil
			}
			tn := b.tenant(t)
			limited := b.named(t, tn, "x.shop.example")
			in := b.start(t, "w", worker.Config{Issuer: fake, Concurrency: 2, PollInterval: time.Hour})
			workertest.Eventually(t, 10*time.Second, "the rate limit's pause", func() bool {
				return b.pauseLeft(t, tc.scope, tc.key, issuing.PauseRateLimit) > 0
			})
			require.InDelta(t, time.Hour.Seconds(), b.pauseLeft(t, tc.scope, tc.key, issuing.PauseRateLimit).Seconds(), 60)
			workertest.Eventually(t, 10*time.Second, "the hand-back", func() bool { return b.status(t, limited) == "pending" })
			r := b.row(t, limited)
			require.Zero(t, r.Attempts, "a rate limit was charged")
			require.Nil(t, r.Error)
			require.Nil(t, r.Token)
			in.WaitForMetric(t, 1, 10*time.Second, "certworker_issuance_total", "rate_limited")

			passes := in.Logs.FilterMessage("pass finished").Len()
			sibling := b.named(t, tn, "y.shop.example")
			elsewhere := b.named(t, tn, "other.example")
			in.WaitForLog(t, "pass finished", passes+1, 10*time.Second)
			if tc.elsewhereOrdered {
				b.waitStatus(t, elsewhere, "active", 10*time.Second)
			}
			if tc.siblingOrdered {
				b.waitStatus(t, sibling, "active", 10*time.Second)
			}
			require.Equal(t, tc.siblingOrdered, fake.Count("y.shop.example") > 0, "the sibling under the same registered domain")
			require.Equal(t, tc.elsewhereOrdered, fake.Count("other.example") > 0, "a name the limit does not cover")
			require.Equal(t, 1, fake.Count("x.shop.example"), "a paused name was ordered again")
		})
	}
}

// A CA that cannot be reached is the CA's problem, not the domain's: the claim is
// handed back uncharged, ordering from the CA is paused for every instance on the
// CA's own backoff (2 s first), and when the pause ends the domain is ordered again,
// the CA answers, and its unreachable state is cleared.
func TestWorker_AnUnreachableCAIsPausedAndTheOrderHandedBackUncharged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	fake.Fail = func(_ string, n int) error {
		if n == 1 {
			return &issuing.CAUnavailableError{Err: errors.New("dial tcp: connection refused")}
		}
		return nil
	}
	id, name := b.domain(t, b.tenant(t))
	in := b.start(t, "w", worker.Config{Issuer: fake, Concurrency: 1, PollInterval: time.Hour})
	fake.Next(t, 10*time.Second)
	workertest.Eventually(t, 10*time.Second, "the CA's pause", func() bool {
		return b.pauseLeft(t, issuing.ScopeCA, workertest.Directory, issuing.PauseUnreachable) > 0
	})
	var failures int
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT failures FROM certworker_pauses WHERE scope = 'ca' AND source = 'unreachable'`).Scan(&failures))
	require.Equal(t, 1, failures)
	b.waitStatus(t, id, "pending", 10*time.Second) // handed back; claimed again once the pause ends
	require.Zero(t, b.row(t, id).Attempts, "an unreachable CA was charged to the domain")
	require.Equal(t, 1.0, in.Metric(t, "certworker_ca_unreachable"))

	b.waitStatus(t, id, "active", 20*time.Second)
	r := b.row(t, id)
	require.Zero(t, r.Attempts)
	require.Nil(t, r.Error)
	require.Equal(t, 2, fake.Count(name))
	in.WaitForMetric(t, 1, 10*time.Second, "certworker_issuance_total", "ca_unavailable")
	workertest.Eventually(t, 10*time.Second, "the unreachable state to be cleared", func() bool {
		return b.pauseLeft(t, issuing.ScopeCA, workertest.Directory, issuing.PauseUnreachable) < 0
	})
	// The gauge is set once the clearing statement has returned, a moment after the
	// row shows it cleared.
	workertest.Eventually(t, 10*time.Second, "certworker_ca_unreachable back to 0", func() bool {
		return in.Metric(t, "certworker_ca_unreachable") == 0
	})
}

// A CA that refuses to see the certificate replaced again (issuing.ReplacesRefusedError)
// holds the one name, uncharged, until the issuer says: the claim is handed back with
// no attempt counted, the name alone is paused for every instance, and its outcome is
// already_replaced. Another name carries on.
func TestWorker_AReplacementRefusedPausesTheNameUncharged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	fake.Fail = func(domain string, _ int) error {
		if domain == "held.example" {
			return &issuing.ReplacesRefusedError{RetryAfter: time.Hour, Detail: "an order replacing it is in progress"}
		}
		return nil
	}
	tn := b.tenant(t)
	held := b.named(t, tn, "held.example")
	other := b.named(t, tn, "other.example")
	in := b.start(t, "w", worker.Config{Issuer: fake, Concurrency: 2, PollInterval: time.Hour})
	workertest.Eventually(t, 10*time.Second, "the name's pause", func() bool {
		return b.pauseLeft(t, issuing.ScopeDomain, "held.example", issuing.PauseRateLimit) > 0
	})
	require.InDelta(t, time.Hour.Seconds(), b.pauseLeft(t, issuing.ScopeDomain, "held.example", issuing.PauseRateLimit).Seconds(), 60)
	workertest.Eventually(t, 10*time.Second, "the hand-back", func() bool { return b.status(t, held) == "pending" })
	require.Zero(t, b.row(t, held).Attempts, "the refusal was charged")
	workertest.Eventually(t, 10*time.Second, "the outcome counted", func() bool {
		return in.Metric(t, "certworker_issuance_total", "already_replaced") >= 1
	})
	b.waitStatus(t, other, "active", 10*time.Second)
	require.Equal(t, 1, fake.Count("held.example"), "a paused name was ordered again")
}

// A database that gives the issuer no answer before anything was sent to the CA (here
// a read of the domain's recorded order timing out, as on a loaded host) is neither the
// CA's trouble nor the domain's: the claim is handed back uncharged, the CA is not
// paused, and the domain is ordered again. An answer of the database's (a refused
// grant) is still charged. Before, both were charged and the domain waited out a
// backoff: an e2e test beside a CPU hog saw a name wait two minutes on one timeout.
func TestWorker_ADatabaseThatGaveTheIssuerNoAnswerIsNotCharged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	noAnswer := &issuing.DatabaseUnavailableError{
		Err: fmt.Errorf("read the domain's recorded order: %w", context.DeadlineExceeded)}
	refused := fmt.Errorf("read the domain's recorded order: %w", &pgconn.PgError{Code: "42501", Message: "permission denied"})
	fake.Fail = func(domain string, n int) error {
		switch {
		case n == 1 && strings.HasPrefix(domain, "timeout"):
			return noAnswer
		case n == 1 && strings.HasPrefix(domain, "refused"):
			return refused
		}
		return nil
	}
	tn := b.tenant(t)
	slowName, deniedName := "timeout-"+uuid.NewString()[:8]+".example", "refused-"+uuid.NewString()[:8]+".example"
	slow, denied := b.named(t, tn, slowName), b.named(t, tn, deniedName)
	in := b.start(t, "w", worker.Config{Issuer: fake, Concurrency: 1, PollInterval: time.Hour})

	b.waitStatus(t, slow, "active", 20*time.Second)
	r := b.row(t, slow)
	require.Zero(t, r.Attempts, "a database that gave no answer was charged to the domain")
	require.Nil(t, r.Error)
	require.Equal(t, 2, fake.Count(slowName))
	require.Negative(t, b.pauseLeft(t, issuing.ScopeCA, workertest.Directory, issuing.PauseUnreachable),
		"the CA was paused for the database's silence")
	in.WaitForMetric(t, 1, 10*time.Second, "certworker_issuance_total", "released")
	in.WaitForLog(t, "order not placed: the database gave no answer before anything was sent to the CA; handed back, not charged", 1, 10*time.Second)

	workertest.Eventually(t, 10*time.Second, "the refused read to be charged", func() bool {
		r := b.row(t, denied)
		return r.Status == "pending" && r.Attempts == 1
	})
	require.Equal(t, 1, fake.Count(deniedName), "retried at once instead of after its backoff")
}
