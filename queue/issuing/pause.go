package issuing

import "time"

// The sources of a pause (certworker_pauses.source).
const (
	// PauseRateLimit: the CA answered rateLimited.
	PauseRateLimit = "rate_limit"
	// PauseLedger: the worker's own ledger says the CA would refuse.
	PauseLedger = "ledger"
	// PauseUnreachable: the CA could not be reached, or answered 5xx.
	PauseUnreachable = "unreachable"
)

// Unreachable is what PauseUnreachable recorded.
type Unreachable struct {
	// Failures is the fleet's count of consecutive orders that found the CA unreachable.
	Failures int
	// For is how long ordering from the CA is paused.
	For time.Duration
}

// PauseState is one pause in force.
type PauseState struct {
	Scope       string    `json:"scope"`
	Key         string    `json:"key"`
	Source      string    `json:"source"`
	PausedUntil time.Time `json:"paused_until"`
	Reason      string    `json:"reason"`
	// Directory is the CA the pause belongs to ("": the first CA's).
	Directory string `json:"directory"`
}
