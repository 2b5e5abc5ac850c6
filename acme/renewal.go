package acme

import (
	"crypto/x509"
	"math/rand/v2"
	"time"

	"github.com/certworker/certworker/queue"
)

// RenewAtFromValidity is the renewal time of a certificate whose CA offers no ACME
// Renewal Information: when a third of its lifetime remains (a 90-day certificate
// renews after 60 days, a 6-day one after 4). It is queue.RenewAtFromValidity: the
// queue applies the same rule to certificates uploaded by hand, and the two have to
// agree. (The queue cannot import this package, which imports it.)
func RenewAtFromValidity(notBefore, notAfter time.Time) time.Time {
	return queue.RenewAtFromValidity(notBefore, notAfter)
}

// renewAtFromWindow picks the renewal time inside a CA's suggested renewal window
// (RFC 9773 §4.2: a uniformly random point, so that a CA's certificates issued at
// the same moment are not all renewed at the same moment).
//
// It reports false for a window it does not trust for a certificate it has just
// received: empty or reversed, or already over (renewing at once would get a new
// certificate with the same window, and renew that at once too, until the CA's rate
// limit stops it). A window that has already opened starts now. The time is never
// after the certificate's expiry.
func renewAtFromWindow(start, end, notAfter, now time.Time) (time.Time, bool) {
	if start.IsZero() || end.IsZero() || !end.After(start) {
		return time.Time{}, false
	}
	if end.After(notAfter) {
		end = notAfter
	}
	if !end.After(now) {
		return time.Time{}, false
	}
	if start.Before(now) {
		start = now
	}
	return start.Add(time.Duration(rand.Int64N(int64(end.Sub(start))))), true
}

// renewAt is the renewal time of a certificate just issued: from the ARI window when
// the CA gave a usable one, else the third-of-lifetime rule. source says which, for
// the log.
func renewAt(leaf *x509.Certificate, windowStart, windowEnd, now time.Time) (at time.Time, source string) {
	// The CA's window may run to the very end of the certificate (Pebble's does for
	// short-lived ones), and a renewal time drawn seconds before expiry leaves no
	// room for a slow or failed order. The last tenth of the lifetime is kept back.
	latest := leaf.NotAfter.Add(-leaf.NotAfter.Sub(leaf.NotBefore) / 10)
	if t, ok := renewAtFromWindow(windowStart, windowEnd, latest, now); ok {
		return t, "ari"
	}
	return RenewAtFromValidity(leaf.NotBefore, leaf.NotAfter), "lifetime"
}
