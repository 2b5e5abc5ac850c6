package pebbletest

import (
	"fmt"
	"net/http"
	"time"

	"golang.org/x/net/publicsuffix"
)

// Answers with what Let's Encrypt really sends, for a Front's rules. The texts are
// Boulder's (github.com/letsencrypt/boulder): the rate limits' from
// ratelimits/limiter.go (Decision.Result) with the links errors/errors.go appends,
// at Let's Encrypt's default limits (letsencrypt.org/docs/rate-limits); the pause's
// from wfe2/wfe.go (NewOrder); the refused name's from policy/pa.go through the
// WFE's "Error creating new order" prefix. Every rate limit is HTTP 429 with
// Retry-After, as Boulder sends it (wfe2/wfe.go, sendError); the pause has none.

const problemNS = "urn:ietf:params:acme:error:"

// RateLimitedOrdersPerAccount is "new orders per account": 300 every 3 hours. Its
// reach is the account, so every name.
func RateLimitedOrdersPerAccount(retryAfter time.Duration) Answer {
	return rateLimited(retryAfter,
		"too many new orders (300) from this account in the last 3h0m0s, retry after %s: see https://letsencrypt.org/docs/rate-limits/#new-orders-per-account",
		retryAt(retryAfter))
}

// RateLimitedRegisteredDomain is "new certificates per registered domain": 50
// every 7 days, for name's registered domain (public suffix list), which it names.
// Its reach is every name under that registered domain.
func RateLimitedRegisteredDomain(name string, retryAfter time.Duration) Answer {
	registered, err := publicsuffix.EffectiveTLDPlusOne(name)
	if err != nil {
		registered = name
	}
	return rateLimited(retryAfter,
		"too many certificates (50) already issued for %q in the last 168h0m0s, retry after %s: see https://letsencrypt.org/docs/rate-limits/#new-certificates-per-registered-domain",
		registered, retryAt(retryAfter))
}

// RateLimitedExactSet is "new certificates per exact set of identifiers": 5 every 7
// days. Its reach is the one set of names (one domain, here).
func RateLimitedExactSet(retryAfter time.Duration) Answer {
	return rateLimited(retryAfter,
		"too many certificates (5) already issued for this exact set of identifiers in the last 168h0m0s, retry after %s: see https://letsencrypt.org/docs/rate-limits/#new-certificates-per-exact-set-of-identifiers",
		retryAt(retryAfter))
}

// RateLimitedFailedAuthorizations is "authorization failures per identifier per
// account": 5 every hour, for name. Its reach is that name.
func RateLimitedFailedAuthorizations(name string, retryAfter time.Duration) Answer {
	return rateLimited(retryAfter,
		"too many failed authorizations (5) for %q in the last 1h0m0s, retry after %s: see https://letsencrypt.org/docs/rate-limits/#authorization-failures-per-identifier-per-account",
		name, retryAt(retryAfter))
}

// UnpauseLinkPrefix starts the link of Paused's detail: Let's Encrypt's
// self-service portal (wfe2's unpauseURL and unpause.GetForm), with a JWT after it.
const UnpauseLinkPrefix = "https://portal.letsencrypt.org/sfe/v1/unpause?jwt="

// Paused is Let's Encrypt's answer to every order for name once it has paused the
// account and name pair after many consecutive failed validations: a rateLimited
// problem without Retry-After, lifted only by a person following its link.
func Paused(name string) Answer {
	// A JWT's shape; the portal is never visited.
	const jwt = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJhcGlWZXJzaW9uIjoidjEifQ.c2lnbmF0dXJl"
	return Answer{Status: http.StatusTooManyRequests, Problem: &Problem{
		Type: problemNS + "rateLimited",
		Detail: fmt.Sprintf("Your account is temporarily prevented from requesting certificates for %s and possibly others. Please visit: %s%s",
			name, UnpauseLinkPrefix, jwt),
	}}
}

// RejectedIdentifier is the CA's refusal to issue for name by policy (a blocked
// name).
func RejectedIdentifier(name string) Answer {
	return Answer{Status: http.StatusBadRequest, Problem: &Problem{
		Type: problemNS + "rejectedIdentifier",
		Detail: fmt.Sprintf("Error creating new order :: Cannot issue for %q: The ACME server refuses to issue a certificate for this domain name, because it is forbidden by policy",
			name),
	}}
}

// ServerInternal is Boulder's answer when it fails inside: a serverInternal problem
// whose detail hides the cause, with status 500 and Retry-After 60 (wfe2/wfe.go,
// sendError).
func ServerInternal() Answer {
	return Answer{Status: http.StatusInternalServerError, RetryAfter: time.Minute, Problem: &Problem{
		Type: problemNS + "serverInternal", Detail: "Error creating new order",
	}}
}

// Unavailable is a load balancer's answer with no CA behind it: status (502, 503,
// 504) and an HTML page, not a problem document.
func Unavailable(status int) Answer {
	return Answer{Status: status, ContentType: "text/html",
		Body: fmt.Sprintf("<html><body><h1>%d %s</h1></body></html>", status, http.StatusText(status))}
}

// Dropped resets the connection: the CA cannot be reached.
func Dropped() Answer { return Answer{Drop: true} }

// TimedOut holds the request until the client gives up: a request that times out.
func TimedOut() Answer { return Answer{Stall: time.Minute} }

func rateLimited(retryAfter time.Duration, format string, args ...any) Answer {
	return Answer{Status: http.StatusTooManyRequests, RetryAfter: retryAfter, Problem: &Problem{
		Type: problemNS + "rateLimited", Detail: fmt.Sprintf(format, args...),
	}}
}

// retryAt is Boulder's "retry after" time: now plus the wait, in UTC.
func retryAt(retryAfter time.Duration) string {
	return time.Now().UTC().Add(retryAfter).Format("2006-01-02 15:04:05 MST")
}

// InvalidProfile is Boulder's answer to a new order naming a profile it does not
// offer (wfe2, validateCertificateProfileName): invalidProfile, 400. A CA answers it
// too for a profile its directory lists but the account may not use.
func InvalidProfile(profile string) Answer {
	return Answer{Status: http.StatusBadRequest, Problem: &Problem{
		Type:   problemNS + "invalidProfile",
		Detail: fmt.Sprintf("profile name %q not recognized", profile),
		Status: http.StatusBadRequest,
	}}
}

// CAAForbidden is a CA's refusal of name because its CAA records do not allow the
// CA to issue (Boulder's VA, va/caa.go: a caa problem, 403), at new-order or
// finalize (where Boulder checks CAA again). Pebble checks no CAA itself: a test
// makes a CA refuse by CAA with a Front rule for the name's new orders and
// finalizes:
//
//	front.Add(pebbletest.Rule{Step: pebbletest.StepFinalize, Names: []string{name},
//		Answer: pebbletest.CAAForbidden(name)})
func CAAForbidden(name string) Answer {
	return Answer{Status: http.StatusForbidden, Problem: &Problem{
		Type:   problemNS + "caa",
		Detail: fmt.Sprintf("While processing CAA for %s: CAA record for %s prevents issuance", name, name),
	}}
}
