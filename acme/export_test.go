package acme

import "time"

// UsualPaceOnly makes the orders iss starts look at the CA's work at the usual pace
// only (pollFirst, issuePollFirst), without the early looks, while on is true: the
// waits orders had before those were added, for a benchmark that compares both in
// one run.
func UsualPaceOnly(iss *Issuer, on bool) { iss.usualPaceOnly.Store(on) }

// LookTimes are the times of an order's first n looks at an authorization (authz
// true) or at an order, from the CA's answer that started the CA's work, at a CA
// that says nothing of when to look and is still at work at every look, by an
// order that already wasted wasted early looks.
func LookTimes(authz bool, wasted, n int) []time.Duration {
	o := &order{wasted: wasted}
	p := o.newPoll(orderEarly, issuePollFirst)
	if authz {
		p = o.newPoll(authzEarly, pollFirst)
	}
	var out []time.Duration
	at := p.start
	for range n {
		w := p.next(at, 0)
		at = at.Add(w)
		out = append(out, at.Sub(p.start))
	}
	return out
}
