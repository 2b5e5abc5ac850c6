package issuing

import (
	"strings"
	"time"
)

// Why a claim went to the second CA (ssl_ca_cause; the label of
// certworker_fallback_decisions_total).
const (
	// FallbackOutage: the first CA's outage pause (unreachable, 5xx) held the domain
	// back for longer than --acme-fallback-after.
	FallbackOutage = "outage"
	// FallbackRateLimit: a rate-limit pause of the first CA did.
	FallbackRateLimit = "rate_limit"
	// FallbackLedger: the ledger's pause of the first CA did.
	FallbackLedger = "ledger"
	// FallbackRefused: the first CA refused the name for good (caa,
	// rejectedIdentifier, unsupportedIdentifier).
	FallbackRefused = "refused"
	// FallbackRenewal: the certificate is the second CA's, and the first is held back.
	FallbackRenewal = "renewal"
)

// DefaultFallbackAfter is --acme-fallback-after: long enough that a CA's hiccup (a
// deploy, a few 5xx) or a rate limit that lifts within minutes does not spread a
// fleet's domains over two CAs, short enough that a tenant who just clicked "verify"
// is not kept waiting through a real outage.
const DefaultFallbackAfter = 10 * time.Minute

// Fallback is the second CA as the claim sees it.
type Fallback struct {
	// Directory is the second CA's ACME directory URL.
	Directory string
	// After is how long a domain may be held back at the first CA before the second
	// is asked (DefaultFallbackAfter when 0).
	After time.Duration
}

// Verdict says which CAs may be asked for a name, by directory (CAA, RFC 8659; the
// worker's). A nil Verdict allows every CA.
type Verdict func(directory string) bool

// Allows reports whether v allows the CA at directory.
func (v Verdict) Allows(directory string) bool { return v == nil || v(directory) }

// Decision is where a claim's order goes.
type Decision struct {
	// Directory is the CA to order from; "" when none is asked now (Wait says why).
	Directory string
	// Cause is why it is the second CA (Fallback*), or "" for the first.
	Cause string
	// Wait: no CA may be asked now, but the first may be later (CAA forbids the
	// second, and the first is held back): the claim goes back uncharged. With
	// Directory "" and Wait false, no CA may ever be asked: the domain fails.
	Wait bool
}

// Decide is where the worker sends claim c's order, whose CA the claim chose
// (c.Directory, c.FallbackCause), given what CAA allows (allowed) and whether the
// first CA has just refused the name for good (refused). primary is the first CA's
// directory; fb the second, nil for none. A CA that CAA forbids, or that refused the
// name, is never asked: the other is, if it may be, at once; when both may not, the
// domain fails. A claim sent to the second for a hold of the first waits for the
// first when CAA forbids the second.
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
	// RefusedByCAA: the name's CAA records forbade the CA (the worker's own check, or
	// the CA's caa problem). CAA that allows the CA again overrides it.
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
