package issuing

import (
	"strings"
	"time"
)

// Why a claim went to the second CA (ssl_ca_cause, and a metric label).
const (
	// FallbackOutage: the first CA's outage pause held the domain back past After.
	FallbackOutage = "outage"
	// FallbackRateLimit: a rate-limit pause of the first CA did.
	FallbackRateLimit = "rate_limit"
	// FallbackLedger: the ledger's pause of the first CA did.
	FallbackLedger = "ledger"
	// FallbackRefused: the first CA refused the name for good.
	FallbackRefused = "refused"
	// FallbackRenewal: the certificate is the second CA's, and the first is held back.
	FallbackRenewal = "renewal"
)

// DefaultFallbackAfter is --acme-fallback-after: long enough that a hiccup does not
// spread a fleet over two CAs, short enough to spare tenants a real outage.
const DefaultFallbackAfter = 10 * time.Minute

// Fallback is the second CA as the claim sees it.
type Fallback struct {
	// Directory is the second CA's ACME directory URL.
	Directory string
	// After is how long the first CA may hold a domain back (0: DefaultFallbackAfter).
	After time.Duration
}

// Verdict says which CAs may be asked for a name, by directory; nil allows all.
type Verdict func(directory string) bool

// Allows reports whether v allows the CA at directory.
func (v Verdict) Allows(directory string) bool { return v == nil || v(directory) }

// Decision is where a claim's order goes.
type Decision struct {
	// Directory is the CA to order from; "" when none is asked now (Wait says why).
	Directory string
	// Cause is why it is the second CA (Fallback*), or "" for the first.
	Cause string
	// Wait: no CA may be asked now, but the first may be later; the claim goes back
	// uncharged. With Directory "" and Wait false, the domain fails.
	Wait bool
}

// Decide is where the worker sends claim c's order, given the claim's choice, what
// CAA allows, and whether the first CA just refused the name. A CA that CAA forbids
// or that refused the name is never asked: the other is, at once, or the domain fails
// when neither may be. A claim sent to the second for a hold of the first waits when
// CAA forbids the second.
func Decide(c Claim, primary string, fb *Fallback, refused bool, allowed Verdict) Decision {
	firstOK := !refused && allowed.Allows(primary)
	if fb == nil {
		if !firstOK {
			return Decision{}
		}
		return Decision{Directory: primary}
	}
	secondOK := allowed.Allows(fb.Directory)
	if c.Directory == fb.Directory {
		firstOK = firstOK && c.FallbackCause != FallbackRefused
		switch {
		case secondOK:
			return Decision{Directory: fb.Directory, Cause: c.FallbackCause}
		case firstOK:
			return Decision{Wait: true}
		}
		return Decision{}
	}
	switch {
	case firstOK:
		return Decision{Directory: primary}
	case secondOK:
		return Decision{Directory: fb.Directory, Cause: FallbackRefused}
	}
	return Decision{}
}

// Why a CA refused a name (proxy_domains.ssl_ca_refused_cause).
const (
	// RefusedByCAA: the name's CAA records forbade the CA; CAA allowing it overrides it.
	RefusedByCAA = "caa"
	// RefusedByCA: the CA's own refusal (rejectedIdentifier, unsupportedIdentifier).
	RefusedByCA = "refused"
	// RefusedTooManyFailures: the name failed validation at the CA as many times in a
	// row as --limit-consecutive-failures allows (the ledger's own stop, before the
	// CA pauses the name for the whole account).
	RefusedTooManyFailures = "too_many_failures"
)

// TooManyFailuresPrefix starts the ssl_error of a domain failed because its name
// failed validation as many times in a row as --limit-consecutive-failures allows at
// every CA it may go to.
const TooManyFailuresPrefix = "too many failures:"

// CAShort is a directory for logs and metrics' sake: "primary" or "fallback".
func CAShort(directory, primary string) string {
	if directory == "" || strings.EqualFold(directory, primary) {
		return "primary"
	}
	return "fallback"
}
