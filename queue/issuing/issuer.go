package issuing

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Issuer turns a domain name into a certificate. The ACME implementation is
// acme.Issuer; tests of the queue use a fake.
//
// Implementations MUST be safe for concurrent use (the worker runs up to
// --concurrency orders at once) and MUST return promptly once ctx is cancelled: the
// worker cancels an order whose claim it has lost, whose --order-timeout has passed,
// whose lease deadline has passed, and at the end of the shutdown grace.
//
// Implementations MUST honour req.Deadline, the claim's local lease deadline: call
// req.Deadline.Check before every request to the CA and send nothing when it fails,
// and bound each request by req.Deadline.Bound, so that a request in flight ends at
// the deadline. Cancelling ctx at the deadline is not enough on its own: the
// cancellation and the next request race, and after a pause of the process (SIGSTOP,
// a long GC) the request can win. Past the deadline another instance may have
// reclaimed the domain and be ordering it; this order must not finalize, nor clean
// up at the CA (a deactivation could hit an authorization the other order shares).
// An order stopped by the deadline returns an error wrapping ErrLeaseDeadline (or
// ctx's cause, which then wraps it); the worker hands its claim back uncharged.
//
// How a failure is treated depends on its type, so an implementation MUST return:
//   - *RateLimitError for a CA's rate limit (not charged; paused by scope);
//   - *CAUnavailableError when the CA could not be reached or answered 5xx (not
//     charged; ordering paused for every instance with its own backoff);
//   - *PreflightError when a check before ordering failed and nothing was sent to the
//     CA (charged; ssl_error starts "preflight:");
//   - *WaitingError when the name cannot be validated yet, by its DNS, and nothing
//     was sent (not charged; the domain waits for its DNS, out of line);
//   - *ReplacesRefusedError when the CA refused a renewal's order naming the
//     certificate it replaces (not charged; the name is paused);
//   - *PermanentError for a refusal no retry can fix (the domain fails at once);
//   - *ProfileError when the CA does not offer the profile the order names (not
//     listed in its directory, and then nothing is sent; or its invalidProfile
//     answer): whose problem that is depends on whose profile it was, which the
//     worker knows;
//   - *KeyError when a stored key the order needs (the ACME account's) does not open
//     with the instance's key encryption keys (not charged; the instance stops
//     claiming until it is restarted with the key);
//   - any other error for a failure charged to the domain and retried with backoff.
//
// An error whose chain holds an AuthorizationFailure that reports true is also
// recorded in the limit ledger as a failed authorization for the name.
type Issuer interface {
	Issue(ctx context.Context, req Request) (*Certificate, error)
}

// Request is one order's input.
type Request struct {
	DomainID string
	// TenantID is the domain's tenant, for the log lines about it.
	TenantID string
	// Domain is already checked (CheckName) and in lower case.
	Domain string
	// CurrentPEM is the stored certificate chain this order renews, or "" for a first
	// issuance. An ACME issuer names it in the order (RFC 9773 "replaces").
	CurrentPEM string
	// Deadline is the claim's local lease deadline (see Issuer), or nil for none.
	Deadline *Deadline
	// ClaimToken is the claim's token (Claim.Token), or "" outside the worker. Writes
	// the order makes for every instance to read, such as its HTTP-01 token, are made
	// under it and only while the claim is held, so that an order that lost its claim
	// cannot overwrite or delete what the order now holding the domain needs.
	ClaimToken string
	// Profile is the ACME profile the order names; "" is the issuer's own default
	// (--acme-profile, which may itself be "": the CA's default).
	Profile string
	// ConfirmClaim, when not nil, MUST be called just before the finalize, the
	// request that makes the CA issue: it renews the claim's lease under its token on
	// the database (Queue.ConfirmClaim) and fails when the claim is not held there
	// with at least a third of the lease ahead, on the database's clock and on the
	// local deadline. Then the issuer sends nothing more and returns an error
	// wrapping the one it got (ErrLeaseDeadline, or ErrClaimLost): the worker hands
	// the claim back uncharged once the database answers. It is what keeps an order
	// whose claim a failover lost (a standby that had not received it) from issuing
	// a second certificate beside the one the new holder orders (docs/high-availability.md).
	// nil outside the worker.
	ConfirmClaim func(ctx context.Context) error
	// Readmit, when set, is called before a renewal is ordered without "replaces"
	// (the CA refused the order naming the certificate, and a third of its lifetime
	// is left): the order is no longer the renewal the ledger admitted, and is
	// admitted again as a new one. An
	// error (a *LedgerRefusedError when the ledger refuses it) stops the order: the
	// issuer sends nothing more and returns it.
	Readmit func(ctx context.Context) error
}

// LedgerRefusedError: the ledger refused an order admitted as a renewal once it was
// to go without "replaces" (Request.Readmit). Not charged: the domain waits, as for
// any ledger limit, under the pause the refusal wrote.
type LedgerRefusedError struct{ Reason string }

func (e *LedgerRefusedError) Error() string { return e.Reason }

// Certificate is what an Issuer hands back for storage.
type Certificate struct {
	// ChainPEM is the full chain, leaf first.
	ChainPEM string
	// PrivateKey is what goes into proxy_certificates.private_key_pem: a PEM key, or
	// its sealed form when the worker runs with --key-encryption-key. The queue stores
	// it as it is and never logs it.
	PrivateKey string
	NotBefore  time.Time
	NotAfter   time.Time
	Issuer     string
	Serial     string
	// Profile is the ACME profile the certificate was issued under, as the CA's order
	// says, or "" when not known (recorded as proxy_certificates.profile).
	Profile string
	// Directory is the ACME directory of the CA that issued it (recorded as
	// proxy_certificates.issuer_directory); the worker sets it, "" for not known.
	Directory string
	// RenewAt is when this certificate should be renewed (ARI, or RenewAtFromValidity:
	// a third of its lifetime before NotAfter, half below 10 days).
	RenewAt time.Time
	// WindowStart and WindowEnd are the CA's suggested renewal window (ARI), or zero
	// when the CA offers none. Past its end, a renewal is urgent (RenewBy);
	// inside it, a renewal naming this certificate is exempt from every limit (Admit).
	WindowStart, WindowEnd time.Time
	// RenewalInfoIn is how long until the CA's renewal information is fetched again
	// (its Retry-After, clamped and jittered: RenewalInfoIn), or zero when the CA
	// offers none. A delay: the queue adds it to the database's clock.
	RenewalInfoIn time.Duration
}

// RenewalWindow is a CA's suggested renewal window for a stored certificate (RFC 9773),
// and when to ask again.
type RenewalWindow struct {
	Start, End time.Time
	// RetryAfter is the CA's Retry-After for the renewal information, or 0 when it
	// gave none.
	RetryAfter time.Duration
}

// RenewalInformer is implemented by an Issuer whose CA offers ACME Renewal Information.
// The worker asks it again for every stored certificate while it is valid, at the
// Retry-After the CA gives, so that a window the CA moves earlier (a revocation) is
// acted on. It returns ErrNoRenewalInfo when the CA offers none.
type RenewalInformer interface {
	RenewalInfo(ctx context.Context, chainPEM string) (*RenewalWindow, error)
}

// ErrNoRenewalInfo: the CA offers no renewal information.
var ErrNoRenewalInfo = errors.New("the CA offers no renewal information")

// The reach of a CA's rate limit (RateLimitError.Scope), which decides what is paused.
const (
	// ScopeCA: an account-wide or unrecognised limit; the whole CA is paused for every
	// instance.
	ScopeCA = "ca"
	// ScopeRegisteredDomain: a limit per registered domain (public suffix list);
	// every name under it is paused.
	ScopeRegisteredDomain = "registered_domain"
	// ScopeDomain: a limit on one name or one exact set of names; that domain alone is
	// paused.
	ScopeDomain = "domain"
)

// RateLimitError is a CA's "rateLimited" answer. It is not charged to the domain:
// the claim is handed back and what the limit covers (Scope) is paused until
// RetryAfter has passed.
type RateLimitError struct {
	// RetryAfter is the CA's Retry-After, or 0 when it gave none.
	RetryAfter time.Duration
	Detail     string
	// Scope is ScopeCA, ScopeRegisteredDomain or ScopeDomain; "" counts as ScopeCA.
	Scope string
	// Limit names the limit that was recognised (for logs and status), or "".
	Limit string
}

func (e *RateLimitError) Error() string {
	if e.RetryAfter > 0 {
		return fmt.Sprintf("rate limited by the CA (retry after %s): %s", e.RetryAfter, e.Detail)
	}
	return "rate limited by the CA: " + e.Detail
}

// ReplacesRefusedError: the CA refused a renewal's order naming the certificate it
// replaces (RFC 9773): it holds a replacement order already (alreadyReplaced) that is
// not ours to resume, or does not know the certificate. Nothing else was sent: an
// order without "replaces" would count against every limit the renewal is exempt
// from. Not charged: the name is paused until RetryAfter, and once a third of the
// certificate's lifetime is left it is ordered without "replaces", admitted by the
// ledger as a new order (Request.Readmit).
type ReplacesRefusedError struct {
	// RetryAfter is how long the name waits before it is ordered again.
	RetryAfter time.Duration
	Detail     string
}

func (e *ReplacesRefusedError) Error() string {
	return "the CA refused to replace the current certificate again: " + e.Detail
}

// CAUnavailableError: the CA could not be reached at some step of the order (no
// connection, a reset, a request that timed out) or answered 5xx. It is the CA's
// problem, not the domain's: not charged, and ordering is paused for every instance.
type CAUnavailableError struct{ Err error }

func (e *CAUnavailableError) Error() string { return "CA unavailable: " + e.Err.Error() }
func (e *CAUnavailableError) Unwrap() error { return e.Err }

// PreflightPrefix starts the ssl_error of a domain whose preflight failed.
const PreflightPrefix = "preflight: "

// PreflightError: a check before ordering (DNS, an HTTP probe of the challenge path)
// failed, and nothing was sent to the CA. Charged like any failure. Msg says what was
// seen, without the prefix.
type PreflightError struct{ Msg string }

func (e *PreflightError) Error() string { return PreflightPrefix + e.Msg }

// WaitingPrefix starts the ssl_error of a domain waiting for its DNS.
const WaitingPrefix = "waiting for DNS: "

// WaitingError: the name cannot be validated yet (it does not point at the proxy, and
// no DNS-01 delegation is in place), and nothing was sent to the CA. Not a failure:
// not charged; the domain waits out of line and is checked again by DNS (a
// DNSChecker). Msg says what was seen and what to set, without the prefix; "" (from
// CheckDNS) means nothing the tenant should read has changed. Answer is a fingerprint
// of the DNS answers seen, so that the HTTP probe runs again only once it changes.
type WaitingError struct {
	Msg    string
	Answer string
	// Seen is the preflight's own verdict, when one was made (errors.As finds it).
	Seen *PreflightError
}

func (e *WaitingError) Error() string { return WaitingPrefix + e.Msg }

func (e *WaitingError) Unwrap() error {
	if e.Seen == nil {
		return nil
	}
	return e.Seen
}

// DNSChecker is implemented by an Issuer that can tell, by DNS (and by the HTTP probe
// once the answer has changed from answer), whether a waiting name can be validated
// now: nil when it can, a *WaitingError while it cannot, any other error when the
// check itself failed (it is tried again later). It sends nothing to the CA.
type DNSChecker interface {
	CheckDNS(ctx context.Context, domain, answer string) error
}

// PermanentError is a failure that no retry can fix (a name no CA can issue for, a
// CA's rejectedIdentifier or caa): the domain goes to 'failed' at once.
type PermanentError struct {
	Err error
	// Refused: the CA refused the name itself (caa, rejectedIdentifier,
	// unsupportedIdentifier), which another CA may not: with a second CA, it is asked
	// at once, and the domain fails only when both have refused.
	Refused bool
	// CAA: the refusal is the CA's reading of the name's CAA records (its caa
	// problem), which the tenant may change: a later look-up that allows the CA
	// overrides it (RefusedByCAA).
	CAA bool
}

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// KeyError: a stored private key an order needs (the ACME account's) does not open
// with the key encryption keys this instance was started with, or does not parse once
// opened. Typically another instance, in the middle of a rotation, sealed it under a
// key this one lacks. It is the operator's problem, never the domain's
// (docs/security.md): not charged; the worker hands the claim back, stops claiming, and reports not
// ready until it is restarted with the key. Its message names the key id it lacks
// where the stored format names one, and never holds a key.
type KeyError struct {
	// Key says which stored key, e.g. "ACME account key of https://ca/directory".
	Key string
	// KeyID is the id of the key encryption key the stored key is sealed under, when
	// its format names one (sealed v2); "" otherwise.
	KeyID string
	Err   error
}

func (e *KeyError) Error() string { return "cannot open the stored " + e.Key + ": " + e.Err.Error() }
func (e *KeyError) Unwrap() error { return e.Err }

// AuthorizationFailure is implemented by errors of orders whose authorization failed
// at the CA (a validation that did not succeed). The CA counts those against a limit
// per name, and so does the ledger.
type AuthorizationFailure interface {
	error
	AuthorizationFailed() bool
}

// IsRateLimit reports whether err is, or wraps, a RateLimitError.
func IsRateLimit(err error) (*RateLimitError, bool) {
	var rl *RateLimitError
	ok := errors.As(err, &rl)
	return rl, ok
}

// IsAuthorizationFailure reports whether err's chain holds an AuthorizationFailure
// that reports true.
func IsAuthorizationFailure(err error) bool {
	var af AuthorizationFailure
	return errors.As(err, &af) && af.AuthorizationFailed()
}
