package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// The waiter's pace. Together with queue.WaitCheckFirst they make the first hour's
// promise: a name whose resolver starts answering with the proxy's
// address is seen at its next check (10 s at most), taken by a waiter within a tick,
// and claimed at once by the instance that saw it.
const (
	// dnsWaitTick is how often the waiter looks for due checks.
	dnsWaitTick = 2 * time.Second
	// dnsWaitBatch bounds the checks one tick takes, and dnsWaitParallel those run
	// at once: each is a few DNS questions and, when the answer changed, one HTTP
	// probe of at most 10 s.
	dnsWaitBatch    = 64
	dnsWaitParallel = 8
	// dnsCheckTimeout bounds one check: the preflight's own bound with room for the
	// choice's DNS questions.
	dnsCheckTimeout = 20 * time.Second
)

// waitForDNS hands the claim back uncharged to wait for its DNS: out of line, its
// ssl_error the wait's message, its next check in queue.WaitCheckFirst.
func (w *Worker) waitForDNS(o *order, log *zap.Logger, we *issuing.WaitingError) string {
	err := w.record(o, log, "wait for DNS", func(ctx context.Context) error {
		return w.q.Wait(ctx, o.claim, we.Error(), we.Answer, queue.WaitCheckFirst)
	})
	if outcome, done := w.notRecorded(o, log, err); done {
		return outcome
	}
	log.Info("waiting for DNS; not charged, checked again by DNS", zap.String("error", we.Error()))
	return "waiting_dns"
}

// dnsWaitLoop checks the domains waiting for their DNS, with the issuer's own checks
// (issuing.DNSChecker), until ctx ends. An issuer that cannot check (a fake) leaves the
// loop idle.
func (w *Worker) dnsWaitLoop(ctx context.Context) {
	checker, ok := w.cfg.Issuer.(issuing.DNSChecker)
	if !ok {
		return
	}
	t := time.NewTimer(dnsWaitTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !w.halted() {
			w.checkWaits(ctx, checker)
		}
		t.Reset(dnsWaitTick)
	}
}

// checkWaits takes the due checks and runs them; a domain whose DNS now allows
// validation goes back in line, and this instance claims it at once.
func (w *Worker) checkWaits(ctx context.Context, checker issuing.DNSChecker) {
	sctx, cancel := w.step(ctx, false)
	retried, err := w.q.ReturnRetried(sctx, dnsWaitBatch)
	cancel()
	if err != nil {
		w.logDBError("return retried waits", err)
	}
	sctx, cancel = w.step(ctx, false)
	due, stale, err := w.q.DueWaits(sctx, dnsWaitBatch)
	cancel()
	if err != nil {
		w.logDBError("take due DNS checks", err)
		return
	}
	var g errgroup.Group
	g.SetLimit(dnsWaitParallel)
	ended := make(chan struct{}, len(due))
	for _, d := range due {
		g.Go(func() error {
			if w.checkWait(ctx, checker, d, stale) {
				ended <- struct{}{}
			}
			return nil
		})
	}
	_ = g.Wait()
	if len(ended) > 0 || retried > 0 {
		select {
		case w.kick <- listener.SourceTimer:
		default:
		}
	}
}

// checkWait runs one check, and reports whether the domain's wait ended with its DNS
// ready.
func (w *Worker) checkWait(ctx context.Context, checker issuing.DNSChecker, d queue.DueWait, stale int) bool {
	log := w.log.With(issuing.LogDomain(d.Domain, d.ID, d.TenantID))
	now := time.Now()
	if now.Sub(d.Since) > w.cfg.DNSWaitMax {
		msg := fmt.Sprintf("%sits DNS never pointed here within %s (--dns-wait-max); point it here, then retry", issuing.WaitingPrefix, w.cfg.DNSWaitMax)
		sctx, cancel := w.step(ctx, true)
		defer cancel()
		if failed, err := w.q.ExpireWait(sctx, d.ID, msg); err != nil {
			w.logDBError("fail a domain whose DNS never pointed here", err)
		} else if failed {
			log.Warn("marked failed: its DNS never pointed here", zap.Duration("waited", now.Sub(d.Since)))
		}
		return false
	}
	name, err := issuing.CheckNameFor(d.Domain, w.cfg.Wildcards)
	if err != nil {
		name = d.Domain // the claim will fail it as invalid
	}
	cctx, cancel := context.WithTimeout(ctx, dnsCheckTimeout)
	cerr := checker.CheckDNS(issuing.WithDomainRef(cctx, issuing.DomainRef{ID: d.ID, TenantID: d.TenantID}), name, d.Answer)
	cancel()
	sctx, scancel := w.step(ctx, true)
	defer scancel()
	var we *issuing.WaitingError
	switch {
	case cerr == nil:
		back, err := w.q.EndWait(sctx, d.ID)
		if err != nil {
			w.logDBError("end a wait for DNS", err)
			return false
		}
		if back {
			log.Info("DNS ready; back in line", zap.Duration("waited", now.Sub(d.Since)))
		}
		return back
	case errors.As(cerr, &we):
		msg := ""
		if we.Msg != "" {
			msg = we.Error()
		}
		if err := w.q.Recheck(sctx, d.ID, queue.WaitCheckIn(now, d.Since, stale), we.Answer, msg); err != nil {
			w.logDBError("schedule a DNS check", err)
		}
	default:
		if ctx.Err() == nil {
			log.Debug("DNS check failed; tried again later", zap.Error(cerr))
		}
		if err := w.q.Recheck(sctx, d.ID, queue.WaitCheckIn(now, d.Since, stale), d.Answer, ""); err != nil {
			w.logDBError("schedule a DNS check", err)
		}
	}
	return false
}
