package acme

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	legoacme "github.com/go-acme/lego/v4/acme"
	"github.com/go-acme/lego/v4/acme/api"
)

// Problem types the issuer acts on (RFC 8555 §6.7, RFC 9773 §7.4).
const (
	problemNS                    = "urn:ietf:params:acme:error:"
	problemRateLimited           = legoacme.RateLimitedErr
	problemAccountDoesNotExist   = problemNS + "accountDoesNotExist"
	problemRejectedIdentifier    = problemNS + "rejectedIdentifier"
	problemUnsupportedIdentifier = problemNS + "unsupportedIdentifier"
	problemCAA                   = problemNS + "caa"
	problemServerInternal        = problemNS + "serverInternal"
	problemBadNonce              = legoacme.BadNonceErr
	// problemInvalidProfile is the CA's refusal of the profile an order names
	// (draft-ietf-acme-profiles; Boulder and Pebble answer it to a new order).
	problemInvalidProfile = problemNS + "invalidProfile"
)

// permanentProblems are the CA's refusals that no retry can fix, because they are
// about the name, not about the moment: the CA's policy refuses it
// (rejectedIdentifier: a blocked name, a name under no public suffix, an ICANN TLD),
// it issues for no such identifier (unsupportedIdentifier), or the name's CAA
// records forbid this CA (caa). Each stays so until the tenant changes something
// (their CAA records, the name), after which `certworker retry` brings the domain
// back; ten orders in the meantime would only spend the CA's limits. A problem whose
// subproblem is one of these counts too (a compound problem, or Boulder's
// rejectedIdentifier with a subproblem per name).
//
// Not here: validation failures (unauthorized, connection, dns, incorrectResponse,
// tls), which a DNS change in flight fixes by itself; problems about the worker
// rather than the name (badCSR, badPublicKey, externalAccountRequired,
// userActionRequired), which a permanent failure would spread to every domain.
// invalidProfile is neither: Issue returns it as a *issuing.ProfileError, and the worker
// decides by whose profile it was (the domain's own, or --acme-profile).
var permanentProblems = map[string]bool{
	problemRejectedIdentifier:    true,
	problemUnsupportedIdentifier: true,
	problemCAA:                   true,
}

// maxErrorLen bounds an error message: it ends up in proxy_domains.ssl_error, which
// operators read in `certworker status`, and a CA answering garbage would otherwise
// put its whole body there.
const (
	maxErrorLen          = 1000
	errorTruncatedSuffix = " [truncated]"
)

// Error is a CA's answer that is an ACME problem document (RFC 8555 §6.7) about the
// order: a failed validation, a refused name, a bad CSR. The worker charges it to
// the domain and retries with backoff (a refusal no retry can fix comes wrapped in a
// *issuing.PermanentError).
type Error struct {
	// Type is the problem type, e.g. urn:ietf:params:acme:error:unauthorized.
	Type string
	// Detail is the CA's explanation, with its subproblems.
	Detail string
	// Status is the HTTP status the problem came with.
	Status int
	// Authorization is true when the problem is the CA's verdict on an
	// authorization of the order (its validation failed): the CA counts those
	// against a limit per name, and so does the worker's ledger.
	Authorization bool
}

func (e *Error) Error() string {
	return truncate("acme: " + e.Type + ": " + e.Detail)
}

// AuthorizationFailed implements issuing.AuthorizationFailure.
func (e *Error) AuthorizationFailed() bool { return e.Authorization }

var _ issuing.AuthorizationFailure = (*Error)(nil)

// failure is any other failure (an answer that is not ACME, a local error): its
// message is cut to a length fit for ssl_error, and it wraps the cause so that
// errors.Is(err, context.Canceled) still works.
type failure struct {
	msg string
	err error
}

func (e *failure) Error() string { return e.msg }
func (e *failure) Unwrap() error { return e.err }

// pausedError is Let's Encrypt's pause of an account and name after many
// consecutive failed validations. It is lifted only by a person following the
// link the CA gave. The link is bound to the account (it unpauses every name the
// account has paused), so it is the operator's: Issue logs it (unpause_url), and
// the message, which becomes the tenant's ssl_error, only says where it is.
type pausedError struct {
	link   string
	detail string
}

func (e *pausedError) Error() string {
	return truncate("acme: the CA has paused issuance for this name on the account after repeated failed validations; " +
		"an operator must unpause it with the link in certworker's log (unpause_url) (" + problemRateLimited + ": " + e.detail + ")")
}

// validationFailure marks an order's error as the CA's verdict on one of its
// authorizations, for classify.
type validationFailure struct{ err error }

func (e *validationFailure) Error() string { return e.err.Error() }
func (e *validationFailure) Unwrap() error { return e.err }

// classify turns what an order ended with into what the worker acts on:
//   - a *issuing.KeyError as it is (the stored account key does not open);
//   - a *issuing.PermanentError for the CA's pause of the account and name (its
//     unpause link kept for the log) and for the refusals in permanentProblems;
//   - a *issuing.RateLimitError for a rate limit (rateLimited, or any HTTP 429),
//     scoped by classifyRateLimit;
//   - a *issuing.CAUnavailableError when the CA answered 5xx, or could not be
//     reached at some step (tr saw it) and no problem document says otherwise;
//   - an *Error for any other problem document;
//   - a *failure for the rest.
//
// Messages never hold key material: lego's errors carry URLs, problem documents and
// response bodies, never a key.
func classify(err error, tr *orderTransport) error {
	if err == nil {
		return nil
	}
	var ke *issuing.KeyError
	if errors.As(err, &ke) {
		// The operator's problem, told apart by its type: the worker charges
		// nothing for it.
		return ke
	}
	var pd *legoacme.ProblemDetails
	if errors.As(err, &pd) && pd != nil {
		var vf *validationFailure
		return classifyProblem(pd, retryAfterOf(err, tr), errors.As(err, &vf))
	}
	var vf *validationFailure
	if errors.As(err, &vf) {
		// An authorization the CA marked invalid without saying why.
		return &Error{Type: "invalid authorization", Detail: truncate(err.Error()), Authorization: true}
	}
	if tr != nil {
		// A 429 whose body is not a problem document: lego reports a JSON error, but
		// it is still the CA saying "slow down".
		if saw, retryAfter := tr.last429(); saw {
			return rateLimit("the CA answered HTTP 429 Too Many Requests", parseRetryAfter(retryAfter))
		}
		if cause := tr.unreachable(); cause != nil {
			return &issuing.CAUnavailableError{Err: &failure{msg: truncate("acme: " + cause.Error()), err: cause}}
		}
	}
	return &failure{msg: truncate("acme: " + err.Error()), err: err}
}

// classifyProblem classifies a problem document. authorization says it is the CA's
// verdict on an authorization of the order.
func classifyProblem(pd *legoacme.ProblemDetails, retryAfter time.Duration, authorization bool) error {
	detail := problemDetail(pd)
	if link, ok := unpauseLink(pd.Detail); ok {
		return &issuing.PermanentError{Err: &pausedError{link: link, detail: beforeUnpauseLink(pd.Detail)}}
	}
	if pd.Type == problemRateLimited || pd.HTTPStatus == http.StatusTooManyRequests {
		return rateLimit(detail, retryAfter)
	}
	typ := pd.Type
	if typ == "" {
		typ = fmt.Sprintf("HTTP %d", pd.HTTPStatus)
	}
	e := &Error{Type: typ, Detail: detail, Status: pd.HTTPStatus, Authorization: authorization}
	// A problem the CA answered a request with (lego records the request's URL in
	// it), with a 5xx status: the CA's trouble, not the name's. A problem inside an
	// authorization or an order is the CA's verdict on the name, whatever its
	// status.
	if pd.URL != "" && pd.HTTPStatus >= http.StatusInternalServerError {
		return &issuing.CAUnavailableError{Err: e}
	}
	if isPermanent(pd) {
		return &issuing.PermanentError{Err: e, Refused: true, CAA: hasProblem(pd, problemCAA)}
	}
	return e
}

// isPermanent reports whether pd, or one of its subproblems, is a refusal in
// permanentProblems.
func isPermanent(pd *legoacme.ProblemDetails) bool {
	if permanentProblems[pd.Type] {
		return true
	}
	for _, sub := range pd.SubProblems {
		if permanentProblems[sub.Type] {
			return true
		}
	}
	return false
}

// hasProblem reports whether pd, or one of its subproblems, is of type typ.
func hasProblem(pd *legoacme.ProblemDetails, typ string) bool {
	if pd.Type == typ {
		return true
	}
	for _, sub := range pd.SubProblems {
		if sub.Type == typ {
			return true
		}
	}
	return false
}

// retryAfterOf is the Retry-After of the rate limit in err's chain, or of the last
// 429 the order saw.
func retryAfterOf(err error, tr *orderTransport) time.Duration {
	var rle *legoacme.RateLimitedError
	if errors.As(err, &rle) && rle.RetryAfter != "" {
		return parseRetryAfter(rle.RetryAfter)
	}
	if tr != nil {
		if saw, v := tr.last429(); saw {
			return parseRetryAfter(v)
		}
	}
	return 0
}

// rateLimit is a *issuing.RateLimitError scoped by what the detail names.
func rateLimit(detail string, retryAfter time.Duration) error {
	scope, limit := classifyRateLimit(detail)
	return &issuing.RateLimitError{RetryAfter: retryAfter, Detail: detail, Scope: scope, Limit: limit}
}

// problemDetail is a problem's detail followed by its subproblems.
func problemDetail(pd *legoacme.ProblemDetails) string {
	if pd == nil {
		return ""
	}
	var b strings.Builder
	b.WriteString(pd.Detail)
	for _, sub := range pd.SubProblems {
		fmt.Fprintf(&b, "; %s", sub.Type)
		if sub.Identifier.Value != "" {
			fmt.Fprintf(&b, " for %s", sub.Identifier.Value)
		}
		if sub.Detail != "" {
			fmt.Fprintf(&b, ": %s", sub.Detail)
		}
	}
	return truncate(b.String())
}

// problemDetailOf is the detail of the problem document inside err, with its
// subproblems, or "".
func problemDetailOf(err error) string {
	var pd *legoacme.ProblemDetails
	if errors.As(err, &pd) {
		return problemDetail(pd)
	}
	return ""
}

// problemType is the ACME problem type inside err, or "".
func problemType(err error) string {
	var pd *legoacme.ProblemDetails
	if errors.As(err, &pd) && pd != nil {
		return pd.Type
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Type
	}
	return ""
}

// parseRetryAfter reads a Retry-After header (seconds or an HTTP date); 0 when
// absent or unreadable, which the worker reads as "use its own default".
func parseRetryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	parsed, err := api.ParseRetryAfter(strings.TrimSpace(v))
	if err != nil || parsed < 0 {
		return 0
	}
	return parsed
}

// truncate cuts a message to maxErrorLen: a CA answering garbage must not fill
// ssl_error (or a log line) with its whole body.
func truncate(s string) string {
	if len(s) <= maxErrorLen {
		return s
	}
	cut := maxErrorLen - len(errorTruncatedSuffix)
	// Do not split a UTF-8 sequence.
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut] + errorTruncatedSuffix
}
