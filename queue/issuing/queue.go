package issuing

import "errors"

// Sentinel errors.
var (
	// ErrClaimLost: the row is no longer held by this claim (its lease ran out and
	// another instance requeued it). The result is dropped.
	ErrClaimLost = errors.New("claim lost: the domain was requeued by another instance")
	// ErrNotFound: no such domain (or not the caller's tenant's).
	ErrNotFound = errors.New("domain not found")
	// ErrNotACME: the row is still held by the claim, but its provider is no longer
	// acme (the tenant switched it mid-order). The result is dropped and the claim
	// disowned, so that what the tenant uploaded stays.
	ErrNotACME = errors.New("the domain is no longer an ACME domain")
)
