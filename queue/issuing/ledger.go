package issuing

import "errors"

// The outcomes of a ledger row (certworker_ledger.outcome).
const (
	// LedgerPending: the order is in flight; it counts as a certificate.
	LedgerPending = "pending"
	// LedgerIssued: the certificate was issued.
	LedgerIssued = "issued"
	// LedgerFailed: the order reached the CA and failed (counts as an order only).
	LedgerFailed = "failed"
	// LedgerFailedAuthz: the order's authorization failed at the CA.
	LedgerFailedAuthz = "failed_authz"
	// LedgerNotSent: nothing reached the CA that it counts.
	LedgerNotSent = "not_sent"
	// LedgerUnknown: the order outlived any order without its end recorded. It counts
	// as an order and a certificate, as the CA may have (SettleStaleLedger).
	LedgerUnknown = "unknown"
)

var (
	// ErrLedgerBusy: the ledger's lock could not be taken before the context ended.
	ErrLedgerBusy = errors.New("the ledger's lock is held by another session")
	// ErrCommitUnknown: a ledger transaction's COMMIT failed; what it recorded may or
	// may not be there.
	ErrCommitUnknown = errors.New("commit of the ledger's transaction may or may not have gone through")
)
