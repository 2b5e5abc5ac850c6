package acme

import "time"

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
