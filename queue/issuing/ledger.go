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
	// LedgerNotSent: nothing reached the CA that it counts (a preflight that
	// failed, a new order it refused).
	LedgerNotSent = "not_sent"
	// LedgerUnknown: the order outlived any order without its end being recorded
	// (its instance died, or could not write it). It counts as the CA may have
	// counted it: as an order and a certificate (SettleStaleLedger).
	LedgerUnknown = "unknown"
)

var (
	// ErrLedgerBusy: the ledger's lock could not be taken before the context ended.
	ErrLedgerBusy = errors.New("the ledger's lock is held by another session")
	// ErrCommitUnknown: the COMMIT of a ledger transaction failed, which may mean its
	// answer was lost after it went through: what it recorded may or may not be there.
	ErrCommitUnknown = errors.New("commit of the ledger's transaction may or may not have gone through")
)
