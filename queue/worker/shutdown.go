package worker

import (
	"context"
	"errors"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"go.uber.org/zap"
)

// cancelGrace is how long orders cancelled at the end of the shutdown grace get to
// hand themselves back before the shutdown does it and drops their late results.
const cancelGrace = 10 * time.Second

// shutdown runs after the loop has stopped claiming: it waits for the orders in
// flight up to the grace, cancels the rest, and hands back whatever this instance
// still holds. Nothing is left in 'provisioning'.
func (w *Worker) shutdown() {
	if n := w.orders.len(); n > 0 {
		w.log.Info("stopping: waiting for orders in flight", zap.Int("orders", n),
			zap.Duration("grace", w.cfg.ShutdownGrace))
	}
	w.waitForOrders(w.cfg.ShutdownGrace)
	if n := w.orders.len(); n > 0 {
		w.log.Warn("shutdown grace over: handing back orders still running", zap.Int("orders", n))
		for _, o := range w.orders.all() {
			o.cancel(errShutdown)
		}
		w.waitForOrders(cancelGrace)
	}
	close(w.hard)
	for _, o := range w.orders.all() {
		// The order may still be running: from now on it sends the CA nothing, so no
		// deactivation follows the hand-back.
		o.deadline.Expire()
		ctx, cancel := w.step(context.Background(), true)
		if err := w.q.Release(ctx, o.claim, false); err != nil && !errors.Is(err, issuing.ErrClaimLost) {
			w.log.Error("could not hand back a claim; its lease will run out", issuing.LogDomain(o.claim.Domain, o.claim.ID, o.claim.TenantID), zap.Error(err))
		}
		cancel()
		w.orders.remove(o.claim.Token)
	}
	// Claims whose answer was lost, and anything else held under this instance's name.
	w.untracked = true
	w.releaseUntracked(context.Background())
	w.m.setInflight(0)
}

func (w *Worker) waitForOrders(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for w.orders.len() > 0 {
		select {
		case r := <-w.results:
			w.orders.remove(r.token)
		case <-t.C:
			return
		}
	}
}
