package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// The waiter's pace (Config.DNSWait's defaults). Together with queue.WaitCheckFirst
// they make the first hour's promise (docs/cas.md, "Waiting for DNS"), for every
// tenant whatever another tenant's names do: a name whose resolver starts answering
// with the proxy's address is seen at its next check (10 s at most), taken within a
// tick by a free slot, and claimed the moment its check passes.
const (
	// dnsWaitTick is how often the waiter looks for due checks and retried waits; a
	// check that ends frees its slot for the next one at once.
	dnsWaitTick = 2 * time.Second
	// dnsWaitParallel bounds the checks running at once on an instance, and
	// dnsWaitShare those of one tenant: a tenant whose names hold every check to its
	// bound (a web server that accepts and never answers, DNS answers that change at
	// every look so the HTTP probe runs each time) holds at most half the slots.
	dnsWaitParallel = 8
	dnsWaitShare    = 4
	// dnsCheckTimeout bounds one check: the preflight's probe (10 s) with a little
	// room for the choice's DNS questions. A check cut short is tried again later.
	dnsCheckTimeout = 12 * time.Second
	// dnsWaitRetried bounds the retried waits put back in line at a tick.
	dnsWaitRetried = 64
)

// waitForDNS hands the claim back uncharged to wait for its DNS: out of line, its
// ssl_error the wait's message, its next check in the first hour's gap.
func (w *Worker) waitForDNS(o *order, log *zap.Logger, we *issuing.WaitingError) string {
	o.finishing.Store(true)
	err := w.record(o, log, "wait for DNS", func(ctx context.Context) error {
		return w.q.Wait(ctx, o.claim, we.Error(), we.Answer, w.cfg.DNSWait.First)
	})
	if outcome, done := w.notRecorded(o, log, err); done {
		return outcome
	}
	log.Info("waiting for DNS; not charged, checked again by DNS", zap.String("error", we.Error()))
	return "waiting_dns"
}

// checkSlots are the waiter's slots: the checks running on this instance, in all and
// by tenant.
type checkSlots struct {
	mu      sync.Mutex
	running int
	busy    map[string]int
	freed   chan struct{} // a slot freed: look for due checks now
}

func (s *checkSlots) take(tenant string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running++
	s.busy[tenant]++
}

func (s *checkSlots) free(tenant string) {
	s.mu.Lock()
	s.running--
	if s.busy[tenant]--; s.busy[tenant] <= 0 {
		delete(s.busy, tenant)
	}
	s.mu.Unlock()
	select {
	case s.freed <- struct{}{}:
	default:
	}
}

// snapshot is the free slots and the checks running by tenant.
func (s *checkSlots) snapshot(parallel int) (int, map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return parallel - s.running, maps.Clone(s.busy)
}

// dnsWaitLoop checks the domains waiting for their DNS, with the issuer's own checks
// (issuing.DNSChecker), until ctx ends, and returns once its checks have. An issuer
// that cannot check (a fake) leaves the loop idle.
//
// Checks run in slots, not batches: at each tick, and whenever a check ends, the free
// slots take due checks (queue.TakeWaits: round the tenants, at most Share of a
// tenant's running at once), so a slow check holds its own slot only, up to
// CheckTimeout, and never the others' next checks.
func (w *Worker) dnsWaitLoop(ctx context.Context) {
	checker, ok := w.cfg.Issuer.(issuing.DNSChecker)
	if !ok {
		return
	}
	slots := &checkSlots{busy: map[string]int{}, freed: make(chan struct{}, 1)}
	var checks sync.WaitGroup
	defer checks.Wait()
	tick := time.NewTicker(w.cfg.DNSWait.Tick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if !w.halted() {
				w.returnRetried(ctx)
			}
		case <-slots.freed:
		}
		if !w.halted() {
			w.takeChecks(ctx, checker, slots, &checks)
		}
	}
}

// returnRetried puts the waits someone retried back in line, and has them claimed.
func (w *Worker) returnRetried(ctx context.Context) {
	sctx, cancel := w.step(ctx, false)
	retried, err := w.q.ReturnRetried(sctx, dnsWaitRetried)
	cancel()
	if err != nil {
		w.logDBError("return retried waits", err)
	}
	if retried > 0 {
		w.kickPass()
	}
}

// takeChecks fills the free slots with due checks and starts them. A check is kept
// from the other instances for as long as it can run: its bound and the step that
// records what it saw.
func (w *Worker) takeChecks(ctx context.Context, checker issuing.DNSChecker, slots *checkSlots, checks *sync.WaitGroup) {
	pace := w.cfg.DNSWait
	free, busy := slots.snapshot(pace.Parallel)
	if free <= 0 {
		return
	}
	sctx, cancel := w.step(ctx, false)
	due, stale, err := w.q.DueWaits(sctx, queue.TakeWaits{Limit: free, Share: pace.Share, Busy: busy,
		Lease: pace.CheckTimeout + w.stepTimeout()})
	cancel()
	if err != nil {
		w.logDBError("take due DNS checks", err)
		return
	}
	for _, d := range due {
		slots.take(d.TenantID)
		checks.Go(func() {
			defer slots.free(d.TenantID)
			if w.checkWait(ctx, checker, d, stale) {
				w.kickPass() // claimed now, not when other checks end
			}
		})
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
	cctx, cancel := context.WithTimeout(ctx, w.cfg.DNSWait.CheckTimeout)
	cerr := checker.CheckDNS(issuing.WithDomainRef(cctx, issuing.DomainRef{ID: d.ID, TenantID: d.TenantID}), name, d.Answer)
	cancel()
	sctx, scancel := w.step(ctx, true)
	defer scancel()
	checkIn := queue.WaitCheckIn(now, d.Paced, stale, w.cfg.DNSWait.First)
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
		if err := w.q.Recheck(sctx, d.ID, checkIn, w.cfg.DNSWait.First, we.Answer, msg); err != nil {
			w.logDBError("schedule a DNS check", err)
		}
	default:
		if ctx.Err() == nil {
			log.Debug("DNS check failed; tried again later", zap.Error(cerr))
		}
		if err := w.q.Recheck(sctx, d.ID, checkIn, w.cfg.DNSWait.First, d.Answer, ""); err != nil {
			w.logDBError("schedule a DNS check", err)
		}
	}
	return false
}
