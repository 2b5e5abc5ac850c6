package issuing

import (
	"math/rand/v2"
	"time"
)

// The rules for when to renew a certificate from its CA's ACME Renewal Information
// (RFC 9773), shared by the issuer (a certificate just issued) and the worker (a
// stored certificate whose window the CA moved).

const (
	// RenewalInfoDefault is when renewal information is asked again when the CA
	// sent no Retry-After. Let's Encrypt and Pebble both send six hours; RFC 9773
	// §4.3 leaves the choice to the client when none comes.
	RenewalInfoDefault = 6 * time.Hour
	// renewalInfoMin and renewalInfoMax bound the CA's Retry-After, as RFC 9773
	// §4.3 advises: no more often than a minute, no less often than a day.
	renewalInfoMin = time.Minute
	renewalInfoMax = 24 * time.Hour
	// RenewalInfoSoon is when a certificate whose renewal information was not read
	// at issuance (the fleet's budget was spent) is read: as soon as the budget
	// allows.
	RenewalInfoSoon = time.Second
	// RenewalInfoAfterError is when renewal information is asked again after the
	// question failed (the CA down, a malformed answer): soon enough to catch a
	// revocation the same day, rarely enough not to add to a CA's trouble.
	RenewalInfoAfterError = time.Hour
	// renewalInfoJitter: the time to ask again is spread over a tenth of itself. A
	// fleet's certificates issued in one burst (a migration, a mass revocation
	// replaced) would otherwise be asked about in the same second every six hours
	// for as long as they live; a tenth of six hours spreads them over 36 minutes at
	// the first question, and the spreads add up at every one after.
	renewalInfoJitter = 10
)

// RenewAtFromWindow picks the renewal time of a certificate valid from notBefore to
// notAfter inside a CA's suggested renewal window [start, end): a uniformly random
// point (RFC 9773 §4.2, so that certificates issued at the same moment are not all
// renewed at the same moment), never in the certificate's last tenth.
//
// The last tenth of the lifetime is kept back because the CA's window may run to
// the very end of the certificate (Pebble's does for short-lived ones), and a
// renewal drawn seconds before expiry leaves no room for a slow or failed order. A
// window that starts inside it (Let's Encrypt's window for a certificate it means to
// revoke may be 5 to 3 days before the expiry of a 90-day certificate) renews at its
// start; a window already open renews now.
//
// The window's own last tenth is kept back too: a renewal placed inside the window,
// naming the certificate it replaces, is exempt from every limit of Let's Encrypt's
// (and of the ledger's, Admit), and one placed after it is not. A time drawn in the
// window's last seconds would reach the CA after a claim and an order's first steps,
// possibly past the end; during a mass revocation, with an exact-set limit of a few a
// week, that renewal would then wait for days. A window whose first nine tenths are
// already over renews now.
//
// It reports false for a window it does not trust: empty or reversed, already over
// (for a certificate just issued, renewing at once would get a new certificate with
// the same window, and renew that at once too, until the CA's rate limit stops it),
// or starting at or after the expiry.
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
// Retry-After (0 when it gave none): clamped to between a minute and a day (RFC 9773
// §4.3), then jittered. A delay, not a time: the queue adds it to the database's
// clock, the one the time is later compared with.
func RenewalInfoIn(retryAfter time.Duration) time.Duration {
	if retryAfter <= 0 {
		retryAfter = RenewalInfoDefault
	}
	return jitter(min(max(retryAfter, renewalInfoMin), renewalInfoMax))
}

// RenewalInfoRetryIn is how long until renewal information is asked again after the
// question failed, jittered.
func RenewalInfoRetryIn() time.Duration { return jitter(RenewalInfoAfterError) }

// jitter spreads d over a tenth of itself. Upward: the CA's Retry-After is the
// earliest it wants to be asked again (RFC 9773 §4.3); but never past a day, the
// clamp's ceiling. A d of a day (the CA asked for a day or more) spreads downward
// instead: the clamp already asks such a CA sooner than it said.
func jitter(d time.Duration) time.Duration {
	spread := d / renewalInfoJitter
	if d >= renewalInfoMax {
		return renewalInfoMax - time.Duration(rand.Int64N(int64(spread)+1))
	}
	spread = min(spread, renewalInfoMax-d)
	return d + time.Duration(rand.Int64N(int64(spread)+1))
}
