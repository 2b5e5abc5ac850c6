package acme

import (
	"errors"
	"testing"
	"time"

	legoacme "github.com/go-acme/lego/v4/acme"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
)

// The renewal time inside an ARI window. Guards against a window already over for
// a certificate just issued (a CA bug, or a clock far off) making the worker renew at
// once, get the same window, and renew again until the CA rate-limits it; and
// against a renewal time past the certificate's expiry.
func TestRenewAtFromWindow(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	notAfter := now.Add(90 * 24 * time.Hour)
	for _, tc := range []struct {
		name       string
		start, end time.Time
		ok         bool
		lo, hi     time.Time
	}{
		{"future window", now.Add(50 * 24 * time.Hour), now.Add(52 * 24 * time.Hour), true,
			now.Add(50 * 24 * time.Hour), now.Add(52 * 24 * time.Hour)},
		{"window already open starts now", now.Add(-time.Hour), now.Add(time.Hour), true, now, now.Add(time.Hour)},
		{"window past expiry is cut at expiry", notAfter.Add(-time.Hour), notAfter.Add(time.Hour), true,
			notAfter.Add(-time.Hour), notAfter},
		{"window over", now.Add(-2 * time.Hour), now.Add(-time.Hour), false, time.Time{}, time.Time{}},
		{"reversed window", now.Add(2 * time.Hour), now.Add(time.Hour), false, time.Time{}, time.Time{}},
		{"empty window", time.Time{}, time.Time{}, false, time.Time{}, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 50 {
				got, ok := renewAtFromWindow(tc.start, tc.end, notAfter, now)
				require.Equal(t, tc.ok, ok)
				if !ok {
					continue
				}
				require.False(t, got.Before(tc.lo), "%s before %s", got, tc.lo)
				require.True(t, got.Before(tc.hi), "%s not before %s", got, tc.hi)
			}
		})
	}
}

// Every failure is classified the way the worker relies on. Guards against a rate
// limit charged to the domain, and a problem type lost from the message.
func TestClassify(t *testing.T) {
	t.Parallel()
	rl := classify(&legoacme.RateLimitedError{
		ProblemDetails: &legoacme.ProblemDetails{Type: legoacme.RateLimitedErr, Detail: "slow", HTTPStatus: 429},
		RetryAfter:     "12",
	}, nil)
	var rle *queue.RateLimitError
	require.ErrorAs(t, rl, &rle)
	require.Equal(t, 12*time.Second, rle.RetryAfter)
	require.Equal(t, "slow", rle.Detail)

	wrapped := classify(errors.Join(errors.New("order"), &legoacme.ProblemDetails{
		Type: "urn:ietf:params:acme:error:rejectedIdentifier", Detail: "policy forbids", HTTPStatus: 400,
		SubProblems: []legoacme.SubProblem{{Type: "urn:ietf:params:acme:error:caa", Detail: "CAA forbids",
			Identifier: legoacme.Identifier{Type: "dns", Value: "a.example"}}},
	}), nil)
	require.Equal(t, "acme: urn:ietf:params:acme:error:rejectedIdentifier: policy forbids; urn:ietf:params:acme:error:caa for a.example: CAA forbids", wrapped.Error())

	tr := &orderTransport{}
	tr.saw429, tr.retryAfter = true, "3"
	plain429 := classify(errors.New("429 :: POST :: not json"), tr)
	require.ErrorAs(t, plain429, &rle)
	require.Equal(t, 3*time.Second, rle.RetryAfter)

	long := classify(errors.New(string(make([]byte, 5000))), nil)
	require.LessOrEqual(t, len(long.Error()), maxErrorLen)
}
