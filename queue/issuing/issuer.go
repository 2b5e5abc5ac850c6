package issuing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Issuer turns a domain name into a certificate: acme.Issuer, or a fake in tests.
//
// Implementations MUST be safe for concurrent use, MUST return promptly once ctx is
// cancelled, and MUST honour req.Deadline: call req.Deadline.Check before every
// request to the CA, send nothing when it fails, and bound each request by
// req.Deadline.Bound. Cancelling ctx alone races with the next request, and past the
// deadline another instance may be ordering the domain. Such an order returns an
// error wrapping ErrLeaseDeadline.
//
// A failure's type decides how it is treated: implementations MUST return the typed
// errors of this file where they apply (RateLimitError, CAUnavailableError,
// PreflightError, WaitingError, ReplacesRefusedError, PermanentError, ProfileError,
// KeyError); any other error is charged to the domain and retried. An error holding
// an AuthorizationFailure that reports true is also recorded in the ledger.
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
	// CurrentPEM is the stored chain this order renews (RFC 9773 "replaces"), or "".
	CurrentPEM string
	// Deadline is the claim's local lease deadline (see Issuer), or nil for none.
	Deadline *Deadline
	// ClaimToken is the claim's token, or "" outside the worker. Writes other instances
	// read (the HTTP-01 token) are made under it, so an order that lost its claim cannot
	// overwrite what the new holder needs.
	ClaimToken string
	// Profile is the ACME profile the order names; "" is --acme-profile.
	Profile string
	// ConfirmClaim, when not nil, MUST be called just before the finalize: it fails
	// unless the claim is still held with a third of its lease ahead
	// (Queue.ConfirmClaim), and then the issuer sends nothing more and returns its error.
	// It keeps an order whose claim a failover lost from issuing a second certificate.
	ConfirmClaim func(ctx context.Context) error
	// Readmit, when set, is called before a renewal is ordered without "replaces" (the
	// CA refused to see the certificate replaced again, and a third of its lifetime is
	// left): the order is then admitted by the ledger as a new one. An error (a
	// *LedgerRefusedError) stops the order.
	Readmit func(ctx context.Context) error
}

// LedgerRefusedError: the ledger refused a renewal re-admitted without "replaces"
// (Request.Readmit). Not charged: the domain waits under the pause the refusal wrote.
type LedgerRefusedError struct{ Reason string }

func (e *LedgerRefusedError) Error() string { return e.Reason }

// Certificate is what an Issuer hands back for storage.
type Certificate struct {
	// ChainPEM is the full chain, leaf first.
	ChainPEM string
	// PrivateKey is a PEM key, or its sealed form under --key-encryption-key. The queue
	// stores it as it is and never logs it.
	PrivateKey string
	NotBefore  time.Time
	NotAfter   time.Time
	Issuer     string
	Serial     string
	// Profile is the ACME profile the CA's order names, or "" when not known.
	Profile string
	// Directory is the issuing CA's ACME directory, set by the worker.
	Directory string
	// RenewAt is when this certificate should be renewed (ARI, or RenewAtFromValidity).
	RenewAt time.Time
	// WindowStart and WindowEnd are the CA's suggested renewal window (ARI), or zero.
	WindowStart, WindowEnd time.Time
	// RenewalInfoIn is how long until renewal information is fetched again, or zero.
	RenewalInfoIn time.Duration
}

// RenewalWindow is a CA's suggested renewal window for a stored certificate (RFC 9773),
// and when to ask again.
type RenewalWindow struct {
	Start, End time.Time
	// RetryAfter is the CA's Retry-After, or 0.
	RetryAfter time.Duration
}

// RenewalInformer is implemented by an Issuer whose CA offers ACME Renewal
// Information. The worker asks again at the CA's Retry-After, so a window moved
// earlier (a revocation) is acted on. It returns ErrNoRenewalInfo when there is none.
type RenewalInformer interface {
	RenewalInfo(ctx context.Context, chainPEM string) (*RenewalWindow, error)
}

// ErrNoRenewalInfo: the CA offers no renewal information.
var ErrNoRenewalInfo = errors.New("the CA offers no renewal information")

// The reach of a CA's rate limit (RateLimitError.Scope), which decides what is paused.
const (
	// ScopeCA: an account-wide or unrecognised limit; the whole CA is paused.
	ScopeCA = "ca"
	// ScopeRegisteredDomain: every name under the registered domain is paused.
	ScopeRegisteredDomain = "registered_domain"
	// ScopeDomain: that domain alone is paused.
	ScopeDomain = "domain"
)

// RateLimitError is a CA's "rateLimited" answer. Not charged: the claim is handed
// back and Scope is paused until RetryAfter.
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

// CAUnavailableError: the CA could not be reached or answered 5xx. Not charged;
// ordering is paused for every instance.
type CAUnavailableError struct{ Err error }

func (e *CAUnavailableError) Error() string { return "CA unavailable: " + e.Err.Error() }
func (e *CAUnavailableError) Unwrap() error { return e.Err }

// DatabaseUnavailableError: a statement the issuer needed before anything was sent to
// the CA got no answer from the database (DatabaseAnswered: a timeout, a lost
// connection, a server that cannot serve now). Nothing was ordered, and nothing is
// the domain's fault: not charged; the worker hands the claim back, as it retries its
// own failed steps. An answer (a refused grant, a missing table) stays charged.
type DatabaseUnavailableError struct{ Err error }

func (e *DatabaseUnavailableError) Error() string { return "database unavailable: " + e.Err.Error() }
func (e *DatabaseUnavailableError) Unwrap() error { return e.Err }

// DatabaseAnswered reports whether err is the database's answer (a *pgconn.PgError)
// other than "cannot serve now": class 08, 53, 57P (short of a cancel), and 25006. A
// refusal (lock timeout, constraint, statement_timeout) is an answer; no answer in
// time, a lost connection or a refused connect is not.
func DatabaseAnswered(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return false
	}
	switch {
	case strings.HasPrefix(pg.Code, "08"), strings.HasPrefix(pg.Code, "53"), strings.HasPrefix(pg.Code, "57P"),
		pg.Code == "25006":
		return false
	}
	return true
}

// PreflightPrefix starts the ssl_error of a domain whose preflight failed.
const PreflightPrefix = "preflight: "

// PreflightError: a check before ordering failed and nothing was sent to the CA.
// Charged. Msg says what was seen, without the prefix.
type PreflightError struct{ Msg string }

func (e *PreflightError) Error() string { return PreflightPrefix + e.Msg }

// WaitingPrefix starts the ssl_error of a domain waiting for its DNS.
const WaitingPrefix = "waiting for DNS: "

// WaitingError: the name cannot be validated yet (no address at the proxy, no DNS-01
// delegation); nothing was sent. Not charged: the domain waits out of line for a
// DNSChecker. Msg says what to set ("": nothing new); Answer fingerprints the DNS
// answers, so the HTTP probe reruns only on a change.
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

// DNSChecker is implemented by an Issuer that can tell by DNS whether a waiting name
// can be validated now: nil, a *WaitingError, or an error of the check. It sends
// nothing to the CA.
type DNSChecker interface {
	CheckDNS(ctx context.Context, domain, answer string) error
}

// PermanentError is a failure that no retry can fix (a name no CA can issue for, a
// CA's rejectedIdentifier or caa): the domain goes to 'failed' at once.
type PermanentError struct {
	Err error
	// Refused: the CA refused the name itself; with a second CA, that one is asked at
	// once, and the domain fails only when both refused.
	Refused bool
	// CAA: the refusal comes from the name's CAA records, which a later look-up allowing
	// the CA overrides (RefusedByCAA).
	CAA bool
}

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// KeyError: a stored key an order needs does not open with this instance's key
// encryption keys. Not charged: the worker stops claiming until restarted with the
// key (docs/security.md). Its message names the key id, never a key.
type KeyError struct {
	// Key says which stored key, e.g. "ACME account key of https://ca/directory".
	Key string
	// KeyID is the id of the key encryption key it is sealed under, or "".
	KeyID string
	Err   error
}

func (e *KeyError) Error() string { return "cannot open the stored " + e.Key + ": " + e.Err.Error() }
func (e *KeyError) Unwrap() error { return e.Err }

// AuthorizationFailure is implemented by errors of orders whose authorization failed
// at the CA, which the CA and the ledger count per name.
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
