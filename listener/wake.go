package listener

import (
	"sync"
	"time"
)

// The reasons a worker looks at the queue, the "source" field of its logs and metrics
// (docs/reference.md, "Logs"); a logical stream's wake-up is SourceNotify too.
const (
	// SourceNotify: a trigger said a domain entered the claimable set.
	SourceNotify = "notify"
	// SourceReconnect: the listener (re)connected and may have missed notifications.
	SourceReconnect = "reconnect"
	// SourceTimer: a backoff or a renewal the worker scheduled has fallen due.
	SourceTimer = "timer"
	// SourcePoll: the --poll-interval safety net.
	SourcePoll = "poll"
	// SourceRefill: an order finished while every slot was busy.
	SourceRefill = "refill"
)

// Wake says "look at the queue now", and why.
type Wake struct {
	// Source is one of the Source constants.
	Source string
	// At is when it happened; for merged wake-ups, the earliest.
	At time.Time
}

// mailbox is a wake-up channel with a buffer of one that merges instead of queueing.
type mailbox struct {
	// mu serialises senders; the receiver takes from ch without it.
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
	// One is pending; only a reconnect adds something: the pending one becomes a catch-up.
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
	// Cannot block: mu is held.
	m.ch <- w
}
