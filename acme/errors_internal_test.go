package acme

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	legoacme "github.com/go-acme/lego/v4/acme"
	"github.com/stretchr/testify/require"
)

// Every rate-limit text Let's Encrypt has sent is recognised, with the reach that
// decides what the worker pauses: the whole CA only for the account's limits (or
// an unknown one), every name under a registered domain for its limit, one domain
// for an exact set or a name's failed authorizations. One row per recognised text,
// each a real detail as Boulder writes it (ratelimits/limiter.go and the links of
// errors/errors.go at the dates given; the legacy texts from ra/ra.go before
// 2025-01). Guards against one tenant's limit pausing every tenant, and against a
// text Boulder changed (its links have changed three times) falling back to a
// fleet-wide pause.
func TestClassify_RateLimitScopeFromDetail(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, detail string
		scope, limit string
	}{
		{"new orders per account (current)",
			"too many new orders (300) from this account in the last 3h0m0s, retry after 2026-08-07 16:18:04 UTC: see https://letsencrypt.org/docs/rate-limits/#new-orders-per-account",
			issuing.ScopeCA, LimitOrdersPerAccount},
		{"new orders per account (legacy)",
			"Error creating new order :: too many new orders recently: see https://letsencrypt.org/docs/rate-limits/",
			issuing.ScopeCA, LimitOrdersPerAccount},
		{"certificates per registered domain (current)",
			`too many certificates (50) already issued for "shop.example.co.uk" in the last 168h0m0s, retry after 2026-08-12 09:41:27 UTC: see https://letsencrypt.org/docs/rate-limits/#new-certificates-per-registered-domain`,
			issuing.ScopeRegisteredDomain, LimitCertsPerRegisteredDomain},
		{"certificates per registered domain (legacy)",
			`Error creating new order :: too many certificates already issued for "example.com". Retry after 2024-06-01T10:00:00Z: see https://letsencrypt.org/docs/rate-limits/`,
			issuing.ScopeRegisteredDomain, LimitCertsPerRegisteredDomain},
		{"exact set of identifiers (since 2025-07)",
			"too many certificates (5) already issued for this exact set of identifiers in the last 168h0m0s, retry after 2026-08-09 02:13:55 UTC: see https://letsencrypt.org/docs/rate-limits/#new-certificates-per-exact-set-of-identifiers",
			issuing.ScopeDomain, LimitCertsPerExactSet},
		{"exact set of domains (2024-10 to 2025-06)",
			"too many certificates (5) already issued for this exact set of domains in the last 168h0m0s, retry after 2025-03-04 11:22:33 UTC: see https://letsencrypt.org/docs/rate-limits/#new-certificates-per-exact-set-of-hostnames",
			issuing.ScopeDomain, LimitCertsPerExactSet},
		{"duplicate certificate (legacy)",
			"Error creating new order :: too many certificates (5) already issued for this exact set of domains in the last 168 hours: shop.example.com, retry after 2024-06-01T10:00:00Z: see https://letsencrypt.org/docs/duplicate-certificate-limit/",
			issuing.ScopeDomain, LimitCertsPerExactSet},
		{"failed authorizations per identifier (since 2026-01)",
			`too many failed authorizations (5) for "shop.example.com" in the last 1h0m0s, retry after 2026-08-07 15:16:40 UTC: see https://letsencrypt.org/docs/rate-limits/#authorization-failures-per-identifier-per-account`,
			issuing.ScopeDomain, LimitFailedAuthzPerName},
		{"failed authorizations per hostname (2024-10 to 2026-01)",
			`too many failed authorizations (5) for "shop.example.com" in the last 1h0m0s, retry after 2025-05-06 07:08:09 UTC: see https://letsencrypt.org/docs/rate-limits/#authorization-failures-per-hostname-per-account`,
			issuing.ScopeDomain, LimitFailedAuthzPerName},
		{"failed validation (legacy)",
			"Error creating new order :: too many failed authorizations recently: see https://letsencrypt.org/docs/failed-validation-limit/",
			issuing.ScopeDomain, LimitFailedAuthzPerName},
		{"new registrations per IP address",
			"too many new registrations (10) from this IP address in the last 3h0m0s, retry after 2026-08-07 17:00:00 UTC: see https://letsencrypt.org/docs/rate-limits/#new-registrations-per-ip-address",
			issuing.ScopeCA, LimitRegistrationsPerIP},
		{"new registrations per IPv6 range",
			"too many new registrations (500) from this /48 subnet of IPv6 addresses in the last 3h0m0s, retry after 2026-08-07 17:00:00 UTC: see https://letsencrypt.org/docs/rate-limits/#new-registrations-per-ipv6-range",
			issuing.ScopeCA, LimitRegistrationsPerIP},
		{"registrations for this IP (legacy)",
			"Error creating new account :: too many registrations for this IP: see https://letsencrypt.org/docs/too-many-registrations-for-this-ip/",
			issuing.ScopeCA, LimitRegistrationsPerIP},
		{"pending authorizations (legacy)",
			"Error creating new order :: too many currently pending authorizations: 300: see https://letsencrypt.org/docs/rate-limits/",
			issuing.ScopeCA, LimitPendingAuthzPerAccount},
		{"unrecognised: the whole CA", "slow down", issuing.ScopeCA, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := classify(&legoacme.RateLimitedError{
				ProblemDetails: &legoacme.ProblemDetails{
					Type: problemRateLimited, Detail: tc.detail, HTTPStatus: http.StatusTooManyRequests,
					Method: http.MethodPost, URL: "https://ca.example/acme/new-order",
				},
				RetryAfter: "3600",
			}, nil)
			rl, ok := issuing.IsRateLimit(err)
			require.True(t, ok, "want a RateLimitError, got %T: %v", err, err)
			require.Equal(t, tc.scope, rl.Scope)
			require.Equal(t, tc.limit, rl.Limit)
			require.Equal(t, time.Hour, rl.RetryAfter)
			require.Equal(t, tc.detail, rl.Detail)
		})
	}
}

// Let's Encrypt's pause of an account and name (a rateLimited problem, HTTP 429,
// no Retry-After) is lifted only through its link: the domain fails at once, its
// error keeping the link for the log (Issue logs it) but not in its message, which
// is the tenant's ssl_error, instead of being paused and retried for ever. The detail
// is Boulder's (wfe2/wfe.go, NewOrder). Guards against a paused name read as an
// unrecognised rate limit, which would pause the whole CA again and again.
func TestClassify_PausedIsPermanentWithUnpauseLink(t *testing.T) {
	t.Parallel()
	const link = "https://portal.letsencrypt.org/sfe/v1/unpause?jwt=eyJhbGciOiJIUzI1NiJ9.eyJ2ZXJzaW9uIjoidjEifQ.abc"
	err := classify(&legoacme.RateLimitedError{ProblemDetails: &legoacme.ProblemDetails{
		Type:       problemRateLimited,
		Detail:     "Your account is temporarily prevented from requesting certificates for shop.example.com and possibly others. Please visit: " + link,
		HTTPStatus: http.StatusTooManyRequests, Method: http.MethodPost, URL: "https://ca.example/acme/new-order",
	}}, nil)
	var pe *issuing.PermanentError
	require.ErrorAs(t, err, &pe)
	_, isRL := issuing.IsRateLimit(err)
	require.False(t, isRL)
	require.NotContains(t, err.Error(), "portal.letsencrypt.org")
	require.Contains(t, err.Error(), "with the link in certworker's log (unpause_url) (")
	require.Contains(t, err.Error(), "shop.example.com")
	var paused *pausedError
	require.ErrorAs(t, err, &paused)
	require.Equal(t, link, paused.link)
}

// Refusals no retry can fix fail the domain at once, with the CA's problem in the
// message; others are charged and retried. Guards against ten orders spent on a
// name the CA will never issue for, and against a passing problem (a validation that
// a DNS change fixes) failing a domain for good.
func TestClassify_PermanentProblems(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		pd        *legoacme.ProblemDetails
		permanent bool
	}{
		{"rejectedIdentifier", &legoacme.ProblemDetails{Type: problemRejectedIdentifier, HTTPStatus: 400, URL: "u",
			Detail: `Error creating new order :: Cannot issue for "blocked.example": The ACME server refuses to issue a certificate for this domain name, because it is forbidden by policy`}, true},
		{"unsupportedIdentifier", &legoacme.ProblemDetails{Type: problemUnsupportedIdentifier, HTTPStatus: 400, URL: "u",
			Detail: "Error creating new order :: identifier type not supported"}, true},
		{"caa at validation", &legoacme.ProblemDetails{Type: problemCAA, HTTPStatus: 403,
			Detail: "CAA record for shop.example.com prevents issuance"}, true},
		{"caa as a subproblem", &legoacme.ProblemDetails{Type: problemNS + "compound", HTTPStatus: 403, URL: "u",
			Detail: "Error finalizing order", SubProblems: []legoacme.SubProblem{{Type: problemCAA, Detail: "CAA forbids"}}}, true},
		{"unauthorized validation", &legoacme.ProblemDetails{Type: problemNS + "unauthorized", HTTPStatus: 403,
			Detail: "Invalid response from http://shop.example.com/.well-known/acme-challenge/x: 404"}, false},
		{"dns", &legoacme.ProblemDetails{Type: problemNS + "dns", HTTPStatus: 400,
			Detail: "DNS problem: NXDOMAIN looking up A for shop.example.com"}, false},
		{"badCSR is the worker's, not the name's", &legoacme.ProblemDetails{Type: problemNS + "badCSR", HTTPStatus: 400, URL: "u",
			Detail: "Error finalizing order :: key too small"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := classify(tc.pd, nil)
			var pe *issuing.PermanentError
			require.Equal(t, tc.permanent, errors.As(err, &pe), "%T: %v", err, err)
			e, ok := err.(interface{ Unwrap() error })
			if tc.permanent {
				require.True(t, ok)
				require.IsType(t, &Error{}, e.Unwrap())
			}
			require.Contains(t, err.Error(), "acme: "+tc.pd.Type+": "+tc.pd.Detail)
		})
	}
}

// Every failure is classified the way the worker relies on. Guards against a rate
// limit charged to the domain, a problem type lost from the message, a CA that is
// down charged to the domain, and a CA's garbage filling ssl_error.
func TestClassify(t *testing.T) {
	t.Parallel()
	rl := classify(&legoacme.RateLimitedError{
		ProblemDetails: &legoacme.ProblemDetails{Type: legoacme.RateLimitedErr, Detail: "slow", HTTPStatus: 429},
		RetryAfter:     "12",
	}, nil)
	var rle *issuing.RateLimitError
	require.ErrorAs(t, rl, &rle)
	require.Equal(t, 12*time.Second, rle.RetryAfter)
	require.Equal(t, "slow", rle.Detail)
	require.Equal(t, issuing.ScopeCA, rle.Scope)

	wrapped := classify(errors.Join(errors.New("order"), &legoacme.ProblemDetails{
		Type: "urn:ietf:params:acme:error:malformed", Detail: "bad", HTTPStatus: 400, URL: "u",
		SubProblems: []legoacme.SubProblem{{Type: "urn:ietf:params:acme:error:dns", Detail: "NXDOMAIN",
			Identifier: legoacme.Identifier{Type: "dns", Value: "a.example"}}},
	}), nil)
	require.Equal(t, "acme: urn:ietf:params:acme:error:malformed: bad; urn:ietf:params:acme:error:dns for a.example: NXDOMAIN", wrapped.Error())

	tr := &orderTransport{}
	tr.saw429, tr.retryAfter = true, "3"
	plain429 := classify(errors.New("429 :: POST :: not json"), tr)
	require.ErrorAs(t, plain429, &rle)
	require.Equal(t, 3*time.Second, rle.RetryAfter)

	// A 5xx problem the CA answered a request with is the CA's trouble; a problem
	// inside an authorization is the CA's verdict on the name, whatever its status.
	var ue *issuing.CAUnavailableError
	require.ErrorAs(t, classify(&legoacme.ProblemDetails{Type: problemServerInternal, HTTPStatus: 500, URL: "u"}, nil), &ue)
	verdict := classify(&validationFailure{err: &legoacme.ProblemDetails{Type: problemServerInternal, HTTPStatus: 500}}, nil)
	require.False(t, errors.As(verdict, &ue))
	require.True(t, issuing.IsAuthorizationFailure(verdict), "a validation's verdict feeds the failed-authorizations ledger")
	require.False(t, issuing.IsAuthorizationFailure(wrapped), "a refused order is not a failed authorization")

	down := &orderTransport{}
	down.noteUnavailable(errors.New("POST https://ca.example/acme/new-order: connection refused"))
	require.ErrorAs(t, classify(errors.New("lego: post failed"), down), &ue)

	long := classify(errors.New(string(make([]byte, 5000))), nil)
	require.LessOrEqual(t, len(long.Error()), maxErrorLen)
}
