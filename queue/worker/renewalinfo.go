package worker

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/certworker/certworker/queue"
)

const (
	// renewalInfoBatch is how many certificates one maintenance run asks the CA
	// about; the next run, due at once, takes the rest.
	renewalInfoBatch = 100
	// renewalInfoTimeout bounds one question to the CA.
	renewalInfoTimeout = 30 * time.Second
)

// refreshRenewalInfo asks the CA again, at the Retry-After it gave, for the renewal
// window of every stored certificate while it is valid (RFC 9773): a window the CA
// moved earlier, as it does for a certificate it means to revoke, moves the renewal
// earlier. It returns how many renewals moved.
func (w *Worker) refreshRenewalInfo(ctx context.Context) int {
	ri, ok := w.cfg.Issuer.(queue.RenewalInformer)
	if !ok {
		return 0
	}
	sctx, cancel := w.step(ctx, false)
	due, err := w.q.RenewalInfoDue(sctx, renewalInfoBatch)
	cancel()
	if err != nil {
		w.health.failed()
		w.logDBError("read certificates due for renewal information", err)
		return 0
	}
	moved := 0
	for _, c := range due {
		if ctx.Err() != nil {
			return moved
		}
		info := w.askRenewalInfo(ctx, ri, c)
		sctx, cancel := w.step(ctx, false)
		err := w.q.RecordRenewalInfo(sctx, c.ID, info)
		cancel()
		if err != nil {
			w.logDBError("record renewal information", err)
			continue
		}
		if !info.RenewAt.IsZero() {
			moved++
			w.log.Warn("the CA moved the certificate's renewal window earlier; renewing sooner",
				zap.String("domain", c.Domain), zap.Time("renew_at", info.RenewAt), zap.Time("was", c.RenewAt),
				zap.Time("window_end", info.WindowEnd))
		}
	}
	return moved
}

// askRenewalInfo asks the CA for c's window and works out what it changes.
func (w *Worker) askRenewalInfo(ctx context.Context, ri queue.RenewalInformer, c queue.RenewalInfoCandidate) queue.RenewalInfo {
	now := time.Now()
	qctx, cancel := context.WithTimeout(ctx, renewalInfoTimeout)
	win, err := ri.RenewalInfo(qctx, c.ChainPEM)
	cancel()
	switch {
	case errors.Is(err, queue.ErrNoRenewalInfo):
		return queue.RenewalInfo{} // nothing to ask any more
	case err != nil:
		w.log.Debug("could not get renewal information; asking again later", zap.String("domain", c.Domain),
			zap.Error(err), zap.Duration("retry_in", queue.RenewalInfoAfterError))
		return queue.RenewalInfo{Next: now.Add(queue.RenewalInfoAfterError)}
	}
	info := queue.RenewalInfo{WindowEnd: win.End, Next: queue.RenewalInfoAt(win.RetryAfter, now)}
	// Only a window that moved earlier than the renewal time changes it: a renewal
	// time inside the window is the one drawn when the certificate was stored, and
	// drawing again at every question would only ever pull it earlier.
	if c.RenewAt.Before(win.End) {
		return info
	}
	at, ok := queue.RenewAtFromWindow(win.Start, win.End, c.NotBefore, c.NotAfter, now)
	if !ok && !win.End.After(now) {
		at, ok = now, true // the window is over: renew now
	}
	if ok && at.Before(c.RenewAt) {
		info.RenewAt = at
	}
	return info
}
