package queue

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
// worker cancels an order whose claim it has lost, and at the end of the shutdown
// grace.
type Issuer interface {
	Issue(ctx context.Context, req Request) (*Certificate, error)
}

// Request is one order's input.
type Request struct {
	DomainID string
	// Domain is already checked (CheckName) and in lower case.
	Domain string
	// CurrentPEM is the stored certificate chain this order renews, or "" for a first
	// issuance. An ACME issuer names it in the order (RFC 9773 "replaces").
	CurrentPEM string
}

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
	// RenewAt is when this certificate should be renewed (ARI, or a third of its
	// lifetime before NotAfter).
	RenewAt time.Time
}

// RateLimitError is a CA's "rateLimited" answer. It is not charged to the domain:
// the claim is handed back and the CA paused until RetryAfter has passed.
type RateLimitError struct {
	// RetryAfter is the CA's Retry-After, or 0 when it gave none.
	RetryAfter time.Duration
	Detail     string
}

func (e *RateLimitError) Error() string {
	if e.RetryAfter > 0 {
		return fmt.Sprintf("rate limited by the CA (retry after %s): %s", e.RetryAfter, e.Detail)
	}
	return "rate limited by the CA: " + e.Detail
}

// PermanentError is a failure that no retry can fix (a name no CA can issue for):
// the domain goes to 'failed' at once.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// IsRateLimit reports whether err is, or wraps, a RateLimitError.
func IsRateLimit(err error) (*RateLimitError, bool) {
	var rl *RateLimitError
	ok := errors.As(err, &rl)
	return rl, ok
}
