package issuing

import "time"

// RenewBy is when a renewal of a certificate becomes urgent (its tier of service, docs/internals.md): when a
// fifth of its lifetime is left, or at the end of the CA's renewal window if that comes
// first. A renewal past it is served before first issuances.
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
	// RetryIn is the time until the backoff runs out, on the database's clock (0 when
	// it gave up).
	RetryIn time.Duration
}
