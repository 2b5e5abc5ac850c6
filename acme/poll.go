package acme

import (
	"sync/atomic"
	"time"
)

// The looks at what the CA is at work on (an authorization being validated, an
// order being issued), when the CA says nothing of when to look (no Retry-After).
// Every look after the first comes at most a gap after the last, where the gap is
// pollStep, or a quarter of the time since the CA's answer that started the work,
// whichever is larger, never more than pollMax. So the CA's work is seen done at most
// max(pollStep, a quarter of what the order had waited when it was done) after it was
// done, whatever the CA takes: no pace that a validation just missing a look pays for
// with a second. A quarter costs one request more each time the wait grows by a
// quarter, so the looks grow with the logarithm of the CA's time (docs/internals.md,
// "Polling the CA", has the requests per order).
const (
	// authzFirstLook and orderFirstLook are the first looks at an authorization
	// after the CA answered its challenge, and at an order after its finalize. A
	// CA that decides at once (Pebble validates and issues in milliseconds) is seen
	// done at the first: every wait of ours is added to what a tenant waits after
	// "verify".
	authzFirstLook = 25 * time.Millisecond
	orderFirstLook = 10 * time.Millisecond
	// pollStep is the longest gap between looks in the first moments: 100 ms is
	// what a tenant cannot tell from at once.
	pollStep = 100 * time.Millisecond
	// pollShare is the share of the time already waited that the gap may reach
	// (as a divisor: a quarter).
	pollShare = 4
	// pollMax caps every wait between looks, the CA's Retry-After included, so that
	// a slow CA is asked at least every 10 s.
	pollMax = 10 * time.Second
)

// poll is the schedule of the looks at one thing the CA is at work on, from the CA's
// answer that started it (start). Each look waits for the CA's Retry-After when it
// gave one (capped at pollMax); else it comes at lookAfter of the last look's time.
// Offsets are kept from start, not from the answers, so that the time the CA takes
// to answer a look does not push the next one later.
type poll struct {
	start time.Time
	first time.Duration
	// at is the offset from start of the last look (when it was due), or -1 before
	// the first.
	at time.Duration
	// waited: the last look's wait was not zero.
	waited bool
}

func newPoll(first time.Duration) *poll {
	return &poll{start: time.Now(), first: first, at: -1}
}

// next is the wait before the next look, at now; retryAfter is the Retry-After of
// the CA's last answer, or 0. Being asked means the last look (or the answer that
// started the work) found the CA still at work.
func (p *poll) next(now time.Time, retryAfter time.Duration) time.Duration {
	elapsed := now.Sub(p.start)
	if retryAfter > 0 {
		wait := min(retryAfter, pollMax)
		p.at, p.waited = elapsed+wait, true
		return wait
	}
	due := p.first
	if p.at >= 0 {
		due = lookAfter(p.at)
	}
	p.at = max(due, elapsed)
	p.waited = due > elapsed
	return max(due-elapsed, 0)
}

// lookHook, where a test has set one (export_test.go), is told of every look as it
// is sent: the URL looked at, the start of its poll and when the poll had it due.
// A test holds the issuer's looks to the curve with it, apart from how late a loaded
// machine sends them.
var lookHook atomic.Pointer[func(u string, start, due time.Time, waited bool)]

// sent tells the test hook, if any, of the look at u just due; waited says whether
// it waited for its time (false: it was due by the time the last answer came).
func (p *poll) sent(u string) {
	if h := lookHook.Load(); h != nil {
		(*h)(u, p.start, p.start.Add(p.at), p.waited)
	}
}

// lookAfter is when the look after one due at offset at is due: pollStep or a
// pollShare of at later, whichever is larger, at most pollMax later.
func lookAfter(at time.Duration) time.Duration {
	return at + min(max(pollStep, at/pollShare), pollMax)
}
