package worker

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
)

// dbHealth is what the worker has seen of the database lately: whether its last
// statement failed, and since when they have succeeded.
type dbHealth struct {
	mu      sync.Mutex
	down    bool
	upSince time.Time
}

func (h *dbHealth) ok() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.down {
		h.down, h.upSince = false, time.Now()
	}
}

func (h *dbHealth) failed() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.down = true
}

// upFor is how long statements have succeeded without a failure between them (0
// while the last one failed).
func (h *dbHealth) upFor() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.down {
		return 0
	}
	return time.Since(h.upSince)
}

// heartbeatLoop renews this instance's leases every third of a lease, on a timer of
// its own: a pass, however long its statements take, never delays a renewal, and an
// order survives two missed renewals. It runs until ctx ends, which is after the
// shutdown has handed back what was left.
func (w *Worker) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(w.cfg.Queue.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.renewLeases(ctx)
		}
	}
}

// renewLeases renews the leases of the orders in flight and stops those whose claim
// is gone (fencing: another instance took the row, or an operator did). With no order
// in flight it still makes the round trip, which keeps dbHealth current for the
// reclaim's rule.
func (w *Worker) renewLeases(ctx context.Context) {
	tokens := w.orders.tokens()
	hctx, cancel := context.WithTimeout(ctx, w.cfg.Queue.Lease/3)
	defer cancel()
	lost, err := w.q.Heartbeat(hctx, tokens)
	if err != nil {
		w.health.failed()
		w.m.heartbeatFailed()
		// Orders keep running: while this instance cannot reach the database, no
		// other can reclaim their rows either (see maintain), and their results are
		// written once it is back.
		w.logDBError("renew leases", err)
		return
	}
	w.health.ok()
	for _, t := range lost {
		o := w.orders.get(t)
		if o == nil {
			continue // finished meanwhile
		}
		o.lost.Store(true)
		o.cancel(errLost)
		w.log.Warn("claim lost: another instance or an operator took this domain; stopping the order",
			zap.String("domain", o.claim.Domain), zap.String("domain_id", o.claim.ID))
	}
}
