package acme

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	legoacme "github.com/go-acme/lego/v4/acme"
	"github.com/go-acme/lego/v4/acme/api"

	"github.com/certworker/certworker/queue"
)

// Problem types the issuer acts on (RFC 8555 §6.7).
const (
	problemRateLimited         = legoacme.RateLimitedErr
	problemAccountDoesNotExist = "urn:ietf:params:acme:error:accountDoesNotExist"
)

// maxErrorLen bounds an error message: it ends up in proxy_domains.ssl_error, which
// operators read in `certworker status`, and a CA answering garbage would otherwise
// put its whole body there.
const (
	maxErrorLen          = 1000
	errorTruncatedSuffix = " [truncated]"
)

// Error is a CA's answer that is an ACME problem document (RFC 8555 §6.7) and not a
// rate limit: a failed validation, a refused name, a bad CSR. The worker charges it
// to the domain and retries with backoff.
type Error struct {
	// Type is the problem type, e.g. urn:ietf:params:acme:error:unauthorized.
	Type string
	// Detail is the CA's explanation, with its subproblems.
	Detail string
	// Status is the HTTP status the problem came with.
	Status int
}

func (e *Error) Error() string {
	return truncate("acme: " + e.Type + ": " + e.Detail)
}

// failure is any other failure (the CA unreachable, an answer that is not ACME): its
// message is cut to a length fit for ssl_error, and it wraps the cause so that
// errors.Is(err, context.Canceled) still works.
type failure struct {
	msg string
	err error
}

func (e *failure) Error() string { return e.msg }
func (e *failure) Unwrap() error { return e.err }

// classify turns what lego returned into what the worker acts on: a
// *queue.RateLimitError for a rate limit (rateLimited, or any HTTP 429), an *Error for
// any other problem document, a *failure for the rest. Messages never hold key
// material: lego's errors carry URLs, problem documents and response bodies, never a
// key.
func classify(err error, tr *orderTransport) error {
	if err == nil {
		return nil
	}
	var rle *legoacme.RateLimitedError
	if errors.As(err, &rle) {
		return &queue.RateLimitError{RetryAfter: parseRetryAfter(rle.RetryAfter), Detail: problemDetail(rle.ProblemDetails)}
	}
	var pd *legoacme.ProblemDetails
	if errors.As(err, &pd) && pd != nil {
		if pd.Type == problemRateLimited || pd.HTTPStatus == http.StatusTooManyRequests {
			var retryAfter string
			if tr != nil {
				_, retryAfter = tr.last429()
			}
			return &queue.RateLimitError{RetryAfter: parseRetryAfter(retryAfter), Detail: problemDetail(pd)}
		}
		typ := pd.Type
		if typ == "" {
			typ = fmt.Sprintf("HTTP %d", pd.HTTPStatus)
		}
		return &Error{Type: typ, Detail: problemDetail(pd), Status: pd.HTTPStatus}
	}
	if tr != nil {
		// A 429 whose body is not a problem document: lego reports a JSON error, but
		// it is still the CA saying "slow down".
		if saw, retryAfter := tr.last429(); saw {
			return &queue.RateLimitError{RetryAfter: parseRetryAfter(retryAfter), Detail: "the CA answered HTTP 429 Too Many Requests"}
		}
	}
	return &failure{msg: truncate("acme: " + err.Error()), err: err}
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
// absent or unreadable, which the worker reads as "use --retry-base".
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
