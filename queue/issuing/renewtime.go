package issuing

import (
	"math/rand/v2"
	"time"
)

// When to renew a certificate from its CA's ACME Renewal Information (RFC 9773),
// for the issuer and the worker alike.

const (
	// RenewalInfoDefault is when renewal information is asked again without a
	// Retry-After (RFC 9773 §4.3 leaves it to the client).
	RenewalInfoDefault = 6 * time.Hour
	// renewalInfoMin and renewalInfoMax bound the CA's Retry-After (RFC 9773 §4.3).
	renewalInfoMin = time.Minute
	renewalInfoMax = 24 * time.Hour
	// RenewalInfoSoon is when a certificate not read at issuance (budget spent) is read.
	RenewalInfoSoon = time.Second
	// RenewalInfoAfterError is when renewal information is asked again after a failed
	// question: soon enough for a same-day revocation, rarely enough to spare the CA.
	RenewalInfoAfterError = time.Hour
	// renewalInfoJitter: the next question is spread over a tenth of its delay, so a
	// burst of certificates does not ask in the same second for ever.
	renewalInfoJitter = 10
)

// RenewAtFromWindow picks the renewal time of a certificate valid from notBefore to
// notAfter inside the CA's window [start, end): a uniformly random point (RFC 9773
// §4.2), never in the certificate's last tenth, nor in the window's last tenth.
//
// The certificate's last tenth leaves room for a slow or failed order when the
// window runs to expiry; a window starting inside it renews at its start. The
// window's last tenth keeps the order inside the window, where a renewal is exempt
// from every rate limit. A window already that far along renews now.
//
// It reports false for a window it does not trust: empty or reversed, already over
// (a renewal would get the same window and renew at once again), or starting at or
// after the expiry.
func RenewAtFromWindow(start, end, notBefore, notAfter, now time.Time) (time.Time, bool) {
	if start.IsZero() || end.IsZero() || !end.After(start) || !end.After(now) || !start.Before(notAfter) {
		return time.Time{}, false
	}
	latest := notAfter.Add(-notAfter.Sub(notBefore) / 10)
	from := start
	if now.After(from) {
		from = now
	}
	to := end.Add(-end.Sub(start) / 10)
	if latest.Before(to) {
		to = latest
	}
	if !to.After(from) {
		return from, true
	}
	return from.Add(time.Duration(rand.Int64N(int64(to.Sub(from))))), true
}

// RenewalInfoIn is how long until renewal information is asked again, from the CA's
// Retry-After (0: none): clamped to a minute..a day (RFC 9773 §4.3), then jittered.
func RenewalInfoIn(retryAfter time.Duration) time.Duration {
	if retryAfter <= 0 {
		retryAfter = RenewalInfoDefault
	}
	return jitter(min(max(retryAfter, renewalInfoMin), renewalInfoMax))
}

// RenewalInfoRetryIn is how long until renewal information is asked again after the
// question failed, jittered.
func RenewalInfoRetryIn() time.Duration { return jitter(RenewalInfoAfterError) }

// jitter spreads d over a tenth of itself, upward (the Retry-After is the earliest
// the CA wants) but never past a day; a d of a day spreads downward.
func jitter(d time.Duration) time.Duration {
	spread := d / renewalInfoJitter
	if d >= renewalInfoMax {
		return renewalInfoMax - time.Duration(rand.Int64N(int64(spread)+1))
	}
	spread = min(spread, renewalInfoMax-d)
	return d + time.Duration(rand.Int64N(int64(spread)+1))
}
