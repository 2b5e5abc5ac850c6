package acme

import (
	"regexp"
	"strings"

	"github.com/certworker/certworker/queue/issuing"
)

// The limits a CA's rate-limit answer is recognised as (issuing.RateLimitError.Limit).
// Where the worker's ledger mirrors the limit, the name is the ledger's key in the
// fleet's settings (certworker_settings.limits), so that status and logs name a
// limit the same way whoever enforced it.
const (
	LimitOrdersPerAccount         = "orders_per_account"
	LimitCertsPerRegisteredDomain = "certs_per_registered_domain"
	LimitCertsPerExactSet         = "certs_per_exact_set"
	LimitFailedAuthzPerName       = "failed_authz_per_name"
	LimitRegistrationsPerIP       = "registrations_per_ip"
	LimitPendingAuthzPerAccount   = "pending_authz_per_account"
)

// rateLimits recognises Let's Encrypt's rate-limit answers by what their detail says.
// Boulder writes every one as "<what>: see https://letsencrypt.org/docs/rate-limits/#<limit>"
// (errors/errors.go; the texts are built in ratelimits/limiter.go, Decision.Result),
// and both the words and the anchors have changed over the years (the anchors in
// 2024, 2025 and 2026), so a limit is recognised by either, old or new. The first
// entry with a marker in the detail wins: the exact-set texts also say "already
// issued for", so they come before the registered domain's.
//
// The scope is what the limit covers, and so what the worker pauses:
//   - the account (new orders, pending authorizations) or the worker's address (new
//     registrations: no account, no order): the whole CA;
//   - a registered domain (new certificates per registered domain, counted over the
//     public suffix list's registered domain): every name under it;
//   - one exact set of names, or one name's failed authorizations: that domain.
//
// Anything else is unrecognised and pauses the whole CA, the safe reading.
var rateLimits = []struct {
	limit, scope string
	markers      *regexp.Regexp
}{
	{LimitCertsPerExactSet, issuing.ScopeDomain, anyOf(
		"#new-certificates-per-exact-set-of-identifiers", // since 2025-07
		"#new-certificates-per-exact-set-of-hostnames",   // 2024-10 to 2025-07
		"/docs/duplicate-certificate-limit",              // until 2024-10
		"already issued for this exact set of",           // "identifiers" since 2025-06, "domains" before
	)},
	{LimitFailedAuthzPerName, issuing.ScopeDomain, anyOf(
		"#authorization-failures-per-identifier-per-account", // since 2026-01
		"#authorization-failures-per-hostname-per-account",   // 2024-10 to 2026-01
		"/docs/failed-validation-limit",                      // until 2024-10
		"too many failed authorizations",
	)},
	{LimitCertsPerRegisteredDomain, issuing.ScopeRegisteredDomain, anyOf(
		"#new-certificates-per-registered-domain",
		`too many certificates .*already issued for`, // with "(50)" since 2024-08, without in the legacy texts (gone 2025-01)
	)},
	{LimitOrdersPerAccount, issuing.ScopeCA, anyOf(
		"#new-orders-per-account",
		"too many new orders",
	)},
	{LimitRegistrationsPerIP, issuing.ScopeCA, anyOf(
		"#new-registrations-per-ip-address",
		"#new-registrations-per-ipv6-range",
		"/docs/too-many-registrations-for-this-ip", // until 2024-10
		"too many new registrations",
		"too many registrations for this ip", // legacy (gone 2025-01)
	)},
	{LimitPendingAuthzPerAccount, issuing.ScopeCA, anyOf(
		"too many currently pending authorizations", // legacy (gone 2025-01)
	)},
}

// classifyRateLimit is the scope and the limit a rate-limit detail names;
// issuing.ScopeCA and "" when it names none that is known.
func classifyRateLimit(detail string) (scope, limit string) {
	d := strings.ToLower(detail)
	for _, rl := range rateLimits {
		if rl.markers.MatchString(d) {
			return rl.scope, rl.limit
		}
	}
	return issuing.ScopeCA, ""
}

// anyOf matches a detail, in lower case, that holds one of the markers (regular
// expressions).
func anyOf(markers ...string) *regexp.Regexp {
	return regexp.MustCompile(strings.Join(markers, "|"))
}

// Let's Encrypt pauses an account and name pair after a long run of failed
// validations, and answers every order for the name with (wfe2/wfe.go, NewOrder):
//
//	Your account is temporarily prevented from requesting certificates for NAME and
//	possibly others. Please visit: https://portal.letsencrypt.org/sfe/v1/unpause?jwt=...
//
// as a rateLimited problem without Retry-After. Only a person following the link
// lifts it, so it is a permanent failure, not a pause.
const (
	pausedMarker = "your account is temporarily prevented from requesting certificates"
	unpauseLead  = "Please visit: "
)

// unpauseLink is the link of a pause's detail.
func unpauseLink(detail string) (string, bool) {
	if !strings.Contains(strings.ToLower(detail), pausedMarker) {
		return "", false
	}
	_, rest, ok := strings.Cut(detail, unpauseLead)
	if !ok {
		return "", false
	}
	link, _, _ := strings.Cut(strings.TrimSpace(rest), " ")
	return strings.TrimRight(link, ".,;"), link != ""
}

// beforeUnpauseLink is a pause's detail without its link (which the message gives
// first).
func beforeUnpauseLink(detail string) string {
	before, _, _ := strings.Cut(detail, unpauseLead)
	return strings.TrimSpace(before)
}
