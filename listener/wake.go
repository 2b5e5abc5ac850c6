package listener

import (
	"sync"
	"time"
)

// The reasons a worker looks at the queue, as they appear in the "source" field of its
// logs and metrics (docs/reference.md, "Logs"), defined here once for the listener
// and the worker. A source names why the worker looks, not the transport that said
// so: a logical stream's wake-up is SourceNotify too, so a query keyed on source works
// in both wake modes.
const (
	// SourceNotify: a trigger said a domain entered the claimable set.
	SourceNotify = "notify"
	// SourceReconnect: the listener has just (re)connected and may have missed
	// notifications while it was away, the first connection included.
	SourceReconnect = "reconnect"
	// SourceTimer: a backoff or a renewal the worker scheduled has fallen due.
	SourceTimer = "timer"
	// SourcePoll: the --poll-interval safety net.
	SourcePoll = "poll"
	// SourceRefill: an order finished while every slot was busy, so the worker
	// claims again into the slot it freed.
	SourceRefill = "refill"
)

// Wake says "look at the queue now", and why.
type Wake struct {
	// Source is one of the Source constants.
	Source string
	// At is when the event happened; for merged wake-ups, the earliest of them, so
	// that the time from At to the claim is the longest a domain could have waited.
	At time.Time
}

// mailbox is a wake-up channel with a buffer of one that merges instead of queueing.
type mailbox struct {
	// mu serialises senders, so that the take-merge-put in send is atomic with
	// respect to other senders. The receiver takes from ch without it: a value it
	// takes in the middle of send just means send finds the buffer empty.
	mu sync.Mutex
	ch chan Wake
}

func newMailbox() *mailbox {
	return &mailbox{ch: make(chan Wake, 1)}
}

// send delivers w, or merges it into the wake-up already pending. It never blocks:
// the listener must go back to reading its connection whatever the worker is doing.
func (m *mailbox) send(w Wake) {
	m.mu.Lock()
	defer m.mu.Unlock()
	select {
	case m.ch <- w:
		return
	default:
	}
	// One is pending. The worker will look at the queue anyway, so w adds nothing
	// unless it is a reconnect sitting behind a notify: then the pending one is
	// upgraded, so that the pass that follows says it is a catch-up.
	if w.Source != SourceReconnect {
		return
	}
	select {
	case old := <-m.ch:
		if old.At.Before(w.At) {
			w.At = old.At
		}
	default:
		// The worker took the pending one in the meantime.
	}
	// Cannot block: mu is held, so no other sender can have refilled the buffer
	// since it was emptied above.
	m.ch <- w
}
