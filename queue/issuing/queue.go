package issuing

import "errors"

// Sentinel errors.
var (
	// ErrClaimLost: the row is no longer held by this claim; the result is dropped.
	ErrClaimLost = errors.New("claim lost: the domain was requeued by another instance")
	// ErrNotFound: no such domain (or not the caller's tenant's).
	ErrNotFound = errors.New("domain not found")
	// ErrNotACME: the claim still holds the row, but its provider is no longer acme;
	// the result is dropped and the claim disowned, so the tenant's upload stays.
	ErrNotACME = errors.New("the domain is no longer an ACME domain")
)
