package issuing

import (
	"math"
	"time"
)

// ReplacePaceWindow is how far back the pace of replacements is measured: long
// enough to smooth a batch of orders, short enough to follow a change in pace.
const ReplacePaceWindow = 15 * time.Minute

// ReplaceProgress is how a mass replacement is going (docs/runbook.md,
// CertworkerReplacementTooSlow): the certificates whose ARI window has started and
// are not yet replaced, and when the last will be at the recent pace.
type ReplaceProgress struct {
	// At is the database's clock at the read.
	At time.Time `json:"at"`
	// Due counts the valid, auto-renewed certificates of verified acme domains whose
	// renewal window has started.
	Due int `json:"replace_now"`
	// EarliestExpiry is the earliest notAfter among them (nil: none due).
	EarliestExpiry *time.Time `json:"earliest_expiry,omitempty"`
	// Replaced counts the renewals issued in the last ReplacePaceWindow, from the ledger.
	Replaced int `json:"replaced_recently"`
	// DoneBy is when the last due certificate is replaced at that pace: At when none is
	// due; nil when none was replaced in the window.
	DoneBy *time.Time `json:"done_by,omitempty"`
}

// Late reports whether, at the current pace, some certificate expires before the
// replacements are done.
func (p ReplaceProgress) Late() bool {
	return p.Due > 0 && p.EarliestExpiry != nil && (p.DoneBy == nil || p.DoneBy.After(*p.EarliestExpiry))
}

// DoneBySeconds is DoneBy as Unix seconds, +Inf for never.
func (p ReplaceProgress) DoneBySeconds() float64 {
	if p.DoneBy == nil {
		return math.Inf(1)
	}
	return float64(p.DoneBy.UnixNano()) / 1e9
}
