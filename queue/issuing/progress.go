package issuing

import (
	"math"
	"time"
)

// ReplacePaceWindow is how far back the pace of replacements is measured: long
// enough to smooth over a batch of orders finishing together (a fleet's
// --concurrency of them), short enough to follow a CA that slows down or a fix that
// speeds things up within the quarter hour.
const ReplacePaceWindow = 15 * time.Minute

// ReplaceProgress is how a mass replacement is going (a CA's revocation: every renewal
// window moved to now; docs/runbook.md, CertworkerReplacementTooSlow): the certificates
// whose renewal window (ARI) has started and that are not yet replaced, and when, at
// the pace of the last ReplacePaceWindow, the last of them will be.
type ReplaceProgress struct {
	// At is the database's clock at the read.
	At time.Time `json:"at"`
	// Due counts the valid, auto-renewed certificates of verified acme domains whose
	// renewal window, as last read, has started (ari_window_start passed): each is
	// replaced as soon as it can be, and leaves the count when it is (its
	// replacement's window has not started).
	Due int `json:"replace_now"`
	// EarliestExpiry is the earliest notAfter among them (nil: none due).
	EarliestExpiry *time.Time `json:"earliest_expiry,omitempty"`
	// Replaced counts the renewals issued in the last ReplacePaceWindow, from the
	// ledger (none is recorded while every --limit-* is off).
	Replaced int `json:"replaced_recently"`
	// DoneBy is when the last due certificate is replaced at that pace: At when
	// none is due; nil when some are and none was replaced in the window (never, at
	// this pace).
	DoneBy *time.Time `json:"done_by,omitempty"`
}

// Late reports whether, at the current pace, some certificate expires before the
// replacements are done.
func (p ReplaceProgress) Late() bool {
	return p.Due > 0 && p.EarliestExpiry != nil && (p.DoneBy == nil || p.DoneBy.After(*p.EarliestExpiry))
}

// DoneBySeconds is DoneBy as Unix seconds, +Inf for never: what the alert compares
// with the earliest expiry.
func (p ReplaceProgress) DoneBySeconds() float64 {
	if p.DoneBy == nil {
		return math.Inf(1)
	}
	return float64(p.DoneBy.UnixNano()) / 1e9
}
