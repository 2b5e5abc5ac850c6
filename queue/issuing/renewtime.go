package issuing

import (
	"math/rand/v2"
	"time"
)

// When to renew a certificate from its CA's ACME Renewal Information (RFC 9773),
// for the issuer and the worker alike.

const (
	// RenewalInfoDefault is when renewal information is asked again without a
	// Retry-After.
	RenewalInfoDefault = 6 * time.Hour
	// renewalInfoMin and renewalInfoMax bound the CA's Retry-After (RFC 9773 §4.3).
	renewalInfoMin = time.Minute
	renewalInfoMax = 24 * time.Hour
	// RenewalInfoSoon is when a certificate not read at issuance (budget spent) is read.
	RenewalInfoSoon = time.Second
	// RenewalInfoAfterError is when a failed question is asked again: soon enough for a
	// same-day revocation, rarely enough to spare the CA.
	RenewalInfoAfterError = time.Hour
	// renewalInfoJitter spreads each next question over a tenth of its delay.
	renewalInfoJitter = 10
)

// RenewAtFromWindow picks the renewal time inside the CA's window [start, end) of a
// certificate valid from notBefore to notAfter: a uniformly random point (RFC 9773
// §4.2), kept out of the certificate's last tenth (room for a failed order) and the
// window's last tenth (so the order still reaches the CA inside the window, where it
// is exempt from rate limits). It reports false for a window it does not trust:
// empty, reversed, over, or starting at or after the expiry.
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

// RenewalInfoIn is how long until renewal information is asked again: the CA's
// Retry-After (0: none) clamped to a minute..a day (RFC 9773 §4.3), jittered.
func RenewalInfoIn(retryAfter time.Duration) time.Duration {
	if retryAfter <= 0 {
		retryAfter = RenewalInfoDefault
	}
	return jitter(min(max(retryAfter, renewalInfoMin), renewalInfoMax))
}

// RenewalInfoRetryIn is how long until a failed question is asked again.
func RenewalInfoRetryIn() time.Duration { return jitter(RenewalInfoAfterError) }

// jitter spreads d over a tenth of itself, upward but never past a day.
func jitter(d time.Duration) time.Duration {
	spread := d / renewalInfoJitter
	if d >= renewalInfoMax {
		return renewalInfoMax - time.Duration(rand.Int64N(int64(spread)+1))
	}
	spread = min(spread, renewalInfoMax-d)
	return d + time.Duration(rand.Int64N(int64(spread)+1))
}
