package issuing

import "time"

// RenewBy is when a renewal becomes urgent (docs/internals.md, Order of service): a
// fifth of its lifetime left, or the end of the CA's renewal window if earlier.
func RenewBy(notBefore, notAfter, windowEnd time.Time) time.Time {
	by := notAfter.Add(-notAfter.Sub(notBefore) / 5)
	if !windowEnd.IsZero() && windowEnd.Before(by) {
		return windowEnd
	}
	return by
}

// Failure is what MarkFailed recorded.
type Failure struct {
	// Attempts is the new count.
	Attempts int
	// GaveUp: the domain reached the limit and is now 'failed'.
	GaveUp bool
	// RetryIn is the time until the backoff runs out (0 when it gave up).
	RetryIn time.Duration
}
