package worker

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/queue/issuing"
)

// loopState is what the loop goroutine keeps between wake-ups. Only it touches these.
type loopState struct {
	// timer fires a pass at timerAt (zero: stopped) for timerSource.
	timer       *time.Timer
	timerAt     time.Time
	timerSource string
	// saturated: every slot was busy at the last claim, so a finished order claims again.
	saturated bool
	// idleRetry is the gap before looking again at a queue whose due row the claim did
	// not take; it doubles up to the poll interval, so it cannot become a hot loop.
	idleRetry time.Duration
	// untracked: a claim may have committed unseen; every pass tries to hand it back.
	untracked bool
	// returnHeld: a pass left something due, so the next claim brings held rows back.
	returnHeld bool
	// heldReturnedAt is when a claim last brought held rows back first.
	heldReturnedAt time.Time
	// unseen are the commits a logical stream announced that no look has seen yet
	// (listener.Announcer), since unseenSince; unseenRetry is the next look's delay.
	unseen      []uint32
	unseenSince time.Time
	unseenRetry time.Duration
}

const (
	// minIdleRetry is the first idle retry.
	minIdleRetry = 50 * time.Millisecond
	// wakeRetry is how soon a wake-up's pass that claimed nothing due looks once more
	// (another instance's claim of it may be committing), and the first look for a
	// commit the stream announced that no snapshot has seen yet.
	wakeRetry = 5 * time.Millisecond
	// timerSlack makes the timer fire late rather than early against the database's
	// strict comparison.
	timerSlack = 5 * time.Millisecond
	// maxUnseen bounds the announced commits kept for the next look.
	maxUnseen = 1024
	// untrackedRetry is how soon a pass tries again to hand back lost claims.
	untrackedRetry = time.Second
	// returnHeldEvery bounds how often refills bring held rows back first, so a full
	// queue drains at full speed.
	returnHeldEvery = time.Second
)

// pass claims into the free slots and, when the queue ran dry first, sets the timer
// for the next thing that falls due.
func (w *Worker) pass(ctx context.Context, source string, at time.Time) {
	w.m.wake(source)
	w.log.Debug("wake-up", zap.String("source", source), zap.Time("at", at))
	if w.untracked {
		w.releaseUntracked(ctx)
	}
	if w.halted() {
		return // halted: no claim, and no timer for what falls due
	}
	if a, ok := w.waker.(listener.Announcer); ok {
		w.addUnseen(a.Announced())
	}
	claimed, full := w.fill(ctx, source)
	if full {
		w.log.Debug("pass finished", zap.String("source", source), zap.Int("claimed", claimed), zap.Bool("saturated", true))
		return
	}
	w.schedule(ctx, source, claimed)
}

// finished takes every waiting result off the loop, then refills the freed slots in
// one claim.
func (w *Worker) finished(ctx context.Context, r result) {
	w.settle(r)
	for more := true; more; {
		select {
		case r := <-w.results:
			w.settle(r)
		default:
			more = false
		}
	}
	// Only a full queue refills: otherwise a wake-up or the timer brings what is due.
	if !w.saturated || ctx.Err() != nil || w.halted() {
		return
	}
	w.m.wake(listener.SourceRefill)
	if claimed, full := w.fill(ctx, listener.SourceRefill); !full {
		w.schedule(ctx, listener.SourceRefill, claimed)
	}
}

// settle forgets a finished order and moves the timer to its domain's retry, if
// sooner.
func (w *Worker) settle(r result) {
	w.orders.remove(r.token)
	w.m.setInflight(w.orders.len())
	if r.retryIn > 0 {
		w.setTimerIfSooner(r.retryIn+timerSlack, listener.SourceTimer)
	}
}

// fill claims into the free slots until they are full or nothing more is due.
func (w *Worker) fill(ctx context.Context, source string) (claimed int, full bool) {
	for {
		free := w.cfg.Concurrency - w.orders.len()
		if free <= 0 {
			w.saturated = true
			return claimed, true
		}
		if ctx.Err() != nil || w.halted() {
			return claimed, false
		}
		claims, taken, sent, full := w.claim(ctx, free, source)
		for _, c := range claims {
			w.start(ctx, c, source, sent)
		}
		w.announce(taken)
		claimed += len(claims)
		if !full {
			w.saturated = false
			return claimed, false
		}
	}
}

// claim runs the claim statement for n slots, and the ledger on what it took. It is
// not cancelled by the worker's context: a committed claim is never dropped. claims
// are those the ledger let go, taken the ids of every row claimed; full reports that
// it took all n and the ledger let one go; sent starts the lease deadlines.
func (w *Worker) claim(ctx context.Context, n int, source string) (claims []issuing.Claim, taken []string, sent time.Time, full bool) {
	cctx, cancel := w.step(ctx, true)
	defer cancel()
	sent = time.Now()
	claimFrom, returning := w.q.ClaimInLine, w.bringsHeldBack(source)
	if returning {
		claimFrom = w.q.ClaimShared
	}
	claims, err := claimFrom(cctx, w.owner, w.cfg.Directory, n, w.newcomerSlots(n))
	if err != nil {
		w.health.failed(err)
		w.untracked = true
		w.logDBError("claim", err)
		return nil, nil, sent, false
	}
	w.health.ok()
	if returning {
		w.returnHeld, w.heldReturnedAt = false, time.Now()
	}
	for _, c := range claims {
		taken = append(taken, c.ID)
	}
	admitted, ok := w.admit(ctx, claims)
	// A claim the ledger refused entirely ends the fill, which must not spin.
	return admitted, taken, sent, ok && len(claims) == n && len(admitted) > 0
}

// announce notifies certworker_domain for the rows a claim took, whose history the
// claim wrote without a notification, once the orders are on their way. A failure
// is logged: a listener that misses it reads the history since its last event.
func (w *Worker) announce(ids []string) {
	if len(ids) == 0 {
		return
	}
	ctx, cancel := w.step(context.Background(), true)
	defer cancel()
	if err := w.q.NotifyDomains(ctx, ids); err != nil {
		w.logDBError("notify certworker_domain", err)
	}
}

// bringsHeldBack says whether a pass woken by source brings held rows back first
// (docs/internals.md, The wake path and held rows).
func (w *Worker) bringsHeldBack(source string) bool {
	switch {
	case w.returnHeld:
		return true
	case source == listener.SourceNotify, source == listener.SourcePoll:
		return false
	case source == listener.SourceRefill:
		return time.Since(w.heldReturnedAt) >= returnHeldEvery
	}
	return true
}

// newcomerSlots is how many of n free slots go to first issuances first: a quarter
// of --concurrency, rounded up, less those in flight.
func (w *Worker) newcomerSlots(n int) int {
	quarter := (w.cfg.Concurrency + 3) / 4
	return min(n, max(quarter-w.orders.firstIssuances(), 0))
}

// releaseUntracked hands back, uncharged, claims whose answer was lost.
func (w *Worker) releaseUntracked(ctx context.Context) {
	rctx, cancel := w.step(ctx, true)
	defer cancel()
	released, err := w.q.ReleaseUntracked(rctx, w.owner, w.orders.tokens())
	if err != nil {
		w.health.failed(err)
		w.logDBError("hand back untracked claims", err)
		return
	}
	w.health.ok()
	w.untracked = false
	w.settleNotSent()
	for _, u := range released {
		w.m.outcome("released_untracked", 0)
		w.log.Warn("claim handed back: its statement committed but its answer was lost; not charged",
			issuing.LogDomain(u.Domain, u.ID, u.TenantID))
	}
}

// schedule sets the timer for the next thing that falls due, capped by the poll.
func (w *Worker) schedule(ctx context.Context, source string, claimed int) {
	sctx, cancel := w.step(ctx, false)
	d, ok, unseen, err := w.q.NextDueSeeing(sctx, w.cfg.Directory, w.unseen)
	cancel()
	if err == nil {
		w.keepUnseen(unseen)
	}
	if err == nil && ok && d <= 0 {
		// Due now and not claimed: it may be a held row whose time has come.
		w.returnHeld = true
	}
	switch {
	case err != nil:
		// Not known: look again soon, so a failed query does not hold up a due retry.
		w.health.failed(err)
		w.logDBError("compute next due time", err)
		d, ok = w.nextIdleRetry(), true
	case ok && d > 0:
		w.health.ok()
		w.idleRetry = minIdleRetry
	case ok && len(w.waker.Wakes()) > 0:
		// A wake-up is already waiting: its pass claims it.
		ok = false
	case ok && source == listener.SourceNotify:
		// The change a wake-up announced may not be visible yet: look once more soon.
		d = wakeRetry
	case ok:
		// Another instance holds it, or a pause holds it back: look again, less often.
		d = w.nextIdleRetry()
	}
	if len(w.unseen) > 0 && len(w.waker.Wakes()) == 0 {
		// A commit the stream announced is not visible yet: until it is, this look
		// could not see its rows, and nothing else would bring them before the poll.
		if r := w.nextUnseenRetry(); !ok || r < d {
			d, ok = r, true
		}
	}
	delay, next := w.cfg.PollInterval, listener.SourcePoll
	if ok && d+timerSlack < delay {
		delay, next = d+timerSlack, listener.SourceTimer
	}
	if w.untracked && untrackedRetry < delay {
		delay, next = untrackedRetry, listener.SourceTimer
	}
	w.setTimer(delay, next)
	w.log.Debug("pass finished", zap.String("source", source), zap.Int("claimed", claimed),
		zap.Duration("next_in", delay), zap.String("next_source", next))
}

// addUnseen adds commits a stream announced to those no look has seen yet.
func (w *Worker) addUnseen(xids []uint32) {
	if len(xids) == 0 {
		return
	}
	if len(w.unseen) == 0 {
		w.unseenSince, w.unseenRetry = time.Now(), wakeRetry
	}
	w.unseen = append(w.unseen, xids...)
	if n := len(w.unseen) - maxUnseen; n > 0 {
		// A saturated worker schedules no look for a while; the oldest were
		// committed long enough ago to be seen.
		w.unseen = append(w.unseen[:0], w.unseen[n:]...)
	}
}

// keepUnseen keeps the announced commits a look did not see, for the next. Those
// unseen for a poll interval are left to the poll.
func (w *Worker) keepUnseen(unseen []uint32) {
	if len(unseen) > 0 && time.Since(w.unseenSince) >= w.cfg.PollInterval {
		w.log.Warn("announced commits still not visible after a poll interval; left to the poll (is a synchronous standby not answering?)",
			zap.Int("transactions", len(unseen)), zap.Duration("waited", time.Since(w.unseenSince).Round(time.Millisecond)))
		unseen = nil
	}
	w.unseen = unseen
}

// nextUnseenRetry is how soon to look again for announced commits not yet visible:
// wakeRetry, doubling up to the poll interval.
func (w *Worker) nextUnseenRetry() time.Duration {
	d := max(w.unseenRetry, wakeRetry)
	w.unseenRetry = min(2*d, w.cfg.PollInterval)
	return d
}

func (w *Worker) nextIdleRetry() time.Duration {
	d := max(w.idleRetry, minIdleRetry)
	w.idleRetry = min(2*d, w.cfg.PollInterval)
	return d
}

func (w *Worker) setTimer(d time.Duration, source string) {
	w.timer.Reset(d)
	w.timerAt, w.timerSource = time.Now().Add(d), source
}

func (w *Worker) setTimerIfSooner(d time.Duration, source string) {
	if w.timerAt.IsZero() || time.Now().Add(d).Before(w.timerAt) {
		w.setTimer(d, source)
	}
}
