package worker

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

const (
	// renewalInfoConcurrency bounds one instance's reads in flight: enough to keep up
	// with the default budget alone.
	renewalInfoConcurrency = 16
	// renewalInfoTimeout bounds one read; a slower CA is asked again an hour later.
	renewalInfoTimeout = 10 * time.Second
	// renewalInfoBusy is how soon the reads look again when every due read was taken.
	renewalInfoBusy = time.Second
	// renewalInfoOutage is how long the reads rest after a whole batch failed.
	renewalInfoOutage = time.Minute
)

// renewalInfoLoop asks the CA again, at its Retry-After, for the renewal window of
// every valid stored certificate (RFC 9773), so a window moved earlier moves the
// renewal. Its own goroutine, so a slow CA delays nothing else. Each read is claimed
// (queue.ClaimRenewalInfo) and takes a token of the fleet's budget first.
func (w *Worker) renewalInfoLoop(ctx context.Context) {
	ri, ok := w.cfg.Issuer.(issuing.RenewalInformer)
	if !ok {
		return
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(w.readRenewalInfo(ctx, ri))
	}
}

// readRenewalInfo reads what is due, batch by batch, and says when to look again.
func (w *Worker) readRenewalInfo(ctx context.Context, ri issuing.RenewalInformer) time.Duration {
	for ctx.Err() == nil {
		sctx, cancel := w.step(ctx, false)
		due, ok, err := w.q.NextRenewalInfo(sctx)
		cancel()
		switch {
		case err != nil:
			w.logDBError("next renewal-information read", err)
			return w.cfg.PollInterval
		case !ok:
			return w.cfg.PollInterval
		case due > 0:
			return min(due+timerSlack, w.cfg.PollInterval)
		}
		wait, done := w.readRenewalInfoBatch(ctx, ri)
		if done {
			return wait
		}
	}
	return 0
}

// readRenewalInfoBatch takes tokens, claims as many reads, asks, and records; done
// says to stop for wait.
func (w *Worker) readRenewalInfoBatch(ctx context.Context, ri issuing.RenewalInformer) (wait time.Duration, done bool) {
	rate := w.cfg.RenewalInfoPerSecond
	sctx, cancel := w.step(ctx, false)
	got, wait, err := w.q.TakeRenewalInfoTokens(sctx, w.cfg.Directory, renewalInfoConcurrency, rate)
	cancel()
	if err != nil {
		w.logDBError("take renewal-information tokens", err)
		return w.cfg.PollInterval, true
	}
	if got == 0 {
		return max(wait, timerSlack), true
	}
	sctx, cancel = w.step(ctx, false)
	batch, swept, err := w.q.ClaimRenewalInfo(sctx, got)
	cancel()
	if err != nil {
		w.logDBError("claim renewal-information reads", err)
		batch, swept = nil, 0
	}
	if unused := got - len(batch); unused > 0 {
		// Fewer due than tokens: what was not spent goes back for the fleet.
		sctx, cancel := w.step(ctx, false)
		if err := w.q.ReturnRenewalInfoTokens(sctx, w.cfg.Directory, unused, rate); err != nil {
			w.logDBError("return renewal-information tokens", err)
		}
		cancel()
	}
	switch {
	case err != nil:
		return w.cfg.PollInterval, true
	case len(batch) == 0 && swept == 0:
		return renewalInfoBusy, true
	case len(batch) == 0:
		return 0, false // rows moved out of the way; look again
	}
	if unavailable := w.askRenewalInfoBatch(ctx, ri, batch); unavailable == len(batch) {
		w.log.Warn("the CA answered none of a batch of renewal-information reads; resting before the next",
			zap.Int("reads", len(batch)), zap.Duration("retry_in", renewalInfoOutage))
		return renewalInfoOutage, true
	}
	return 0, false
}

// askRenewalInfoBatch asks about every certificate of batch at once and records the
// answers, returning how many went unanswered.
func (w *Worker) askRenewalInfoBatch(ctx context.Context, ri issuing.RenewalInformer, batch []queue.RenewalInfoCandidate) int {
	var (
		wg          sync.WaitGroup
		mu          sync.Mutex
		unavailable int
	)
	for _, c := range batch {
		wg.Go(func() {
			info, outcome := w.askRenewalInfo(ctx, w.informerFor(c.Directory, ri), c)
			if ctx.Err() != nil {
				return // shutting down: the claim runs out, and someone asks again
			}
			w.m.renewalInfo(outcome)
			if outcome == readUnavailable {
				mu.Lock()
				unavailable++
				mu.Unlock()
			}
			w.recordRenewalInfo(ctx, c, info)
		})
	}
	wg.Wait()
	return unavailable
}

// The outcomes of a renewal-information read (certworker_renewal_info_reads_total).
const (
	readWindow      = "window"      // the CA's window
	readNone        = "none"        // the CA offers none, or the certificate cannot be named to it
	readRefused     = "refused"     // the CA refused the question, or its answer was not a window
	readUnavailable = "unavailable" // no answer: unreachable, 5xx, or not in time
)

// askRenewalInfo asks the CA for c's window and works out what it changes.
func (w *Worker) askRenewalInfo(ctx context.Context, ri issuing.RenewalInformer, c queue.RenewalInfoCandidate) (issuing.RenewalInfo, string) {
	qctx, cancel := context.WithTimeout(ctx, renewalInfoTimeout)
	win, err := ri.RenewalInfo(qctx, c.ChainPEM)
	timedOut := qctx.Err() != nil && ctx.Err() == nil
	cancel()
	var ue *issuing.CAUnavailableError
	switch {
	case errors.Is(err, issuing.ErrNoRenewalInfo):
		return issuing.RenewalInfo{}, readNone // nothing to ask any more
	case err != nil:
		retry := issuing.RenewalInfoRetryIn()
		w.log.Debug("could not get renewal information; asking again later", issuing.LogDomain(c.Domain, c.DomainID, c.TenantID),
			zap.Error(err), zap.Duration("retry_in", retry))
		if timedOut || errors.As(err, &ue) {
			return issuing.RenewalInfo{NextIn: retry}, readUnavailable
		}
		return issuing.RenewalInfo{NextIn: retry}, readRefused
	}
	info := issuing.RenewalInfo{WindowStart: win.Start, WindowEnd: win.End, NextIn: issuing.RenewalInfoIn(win.RetryAfter)}
	// Only a window moved earlier than the renewal time changes it.
	if c.RenewAt.Before(win.End) {
		return info, readWindow
	}
	at, ok := issuing.RenewAtFromWindow(win.Start, win.End, c.NotBefore, c.NotAfter, c.Now)
	switch {
	case !ok && !win.End.After(c.Now):
		info.RenewNow = true // the window is over: renew now
	case ok && at.Before(c.RenewAt):
		info.RenewAt = at
	}
	return info, readWindow
}

// recordRenewalInfo writes what the CA said of c, and on an earlier renewal has the
// maintenance look at it.
func (w *Worker) recordRenewalInfo(ctx context.Context, c queue.RenewalInfoCandidate, info issuing.RenewalInfo) {
	sctx, cancel := w.step(ctx, false)
	readAt := time.Now()
	renewIn, err := w.q.RecordRenewalInfo(sctx, c, info)
	readDone := time.Now()
	cancel()
	switch {
	case errors.Is(err, issuing.ErrCertificateReplaced):
		w.log.Debug("certificate replaced while its renewal information was read; the answer is dropped",
			issuing.LogDomain(c.Domain, c.DomainID, c.TenantID))
		return
	case err != nil:
		w.logDBError("record renewal information", err)
		return
	}
	if info.RenewAt.IsZero() && !info.RenewNow {
		return
	}
	w.log.Warn("the CA moved the certificate's renewal window earlier; renewing sooner",
		issuing.LogDomain(c.Domain, c.DomainID, c.TenantID), zap.Duration("renew_in", renewIn), zap.Time("was", c.RenewAt),
		zap.Time("window_end", info.WindowEnd))
	w.wantMaintenance(aimIn(renewIn, readAt, readDone, "renewal information"))
}

// informerFor is the renewal-information source for a certificate the CA at
// directory issued.
func (w *Worker) informerFor(directory string, first issuing.RenewalInformer) issuing.RenewalInformer {
	if at := w.caOf(directory); at != w.first {
		if ri, ok := at.issuer.(issuing.RenewalInformer); ok {
			return ri
		}
	}
	return first
}
