package acme

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// LookTimes are the times of a poll's first n looks, from the CA's answer that
// started the CA's work, at a CA that says nothing of when to look and is still at
// work at every look: at an authorization (authz true) or at an order.
func LookTimes(authz bool, n int) []time.Duration {
	p := newPoll(orderFirstLook)
	if authz {
		p = newPoll(authzFirstLook)
	}
	var out []time.Duration
	at := p.start
	for range n {
		at = at.Add(p.next(at, 0))
		out = append(out, at.Sub(p.start))
	}
	return out
}

// PollStep and PollShare are the curve's terms: after a wait w, the CA's work is
// seen done at most max(PollStep, w/PollShare) after it was done.
const (
	PollStep  = pollStep
	PollShare = pollShare
)

// ScheduledLook is a look an issuer sent: the URL looked at, the start of its poll
// (the CA's answer that started the work), when the poll had the look due, and
// whether it waited for that time (false: it was due by the time the last answer
// came, and went at once).
type ScheduledLook struct {
	URL        string
	Start, Due time.Time
	Waited     bool
}

// RecordLooks records the looks every issuer of the package sends until the test
// ends, and returns a function that reads them. One test at a time may record.
func RecordLooks(t testing.TB) func() []ScheduledLook {
	var mu sync.Mutex
	var looks []ScheduledLook
	h := func(u string, start, due time.Time, waited bool) {
		mu.Lock()
		defer mu.Unlock()
		looks = append(looks, ScheduledLook{URL: u, Start: start, Due: due, Waited: waited})
	}
	if !lookHook.CompareAndSwap(nil, &h) {
		t.Fatal("another test is recording looks")
	}
	t.Cleanup(func() { lookHook.Store(nil) })
	return func() []ScheduledLook {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(looks)
	}
}
