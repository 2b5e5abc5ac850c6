package queue

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"go.uber.org/zap"

	"github.com/certworker/certworker/listener"
)

// WorkerConfig is how one instance runs.
type WorkerConfig struct {
	// Owner names this instance in ssl_claimed_by (host and pid, say).
	Owner string
	// Concurrency is the number of orders in flight on this instance. The reference
	// issued one at a time: a thirty-second order held up every other domain.
	Concurrency int
	// PollInterval is the safety-net pass, and the longest the timer is ever set for.
	PollInterval time.Duration
	// ShutdownGrace is the time in-flight orders get to finish after the context is
	// cancelled; what is still running then is handed back.
	ShutdownGrace time.Duration
	// Directory identifies the CA, for rate-limit pauses shared by every instance.
	Directory string
}

// Worker claims due domains and runs their orders. It is driven by wake-ups (the
// listener's, and its own timer and poll); the claim query decides what is due.
type Worker struct {
	q       *Queue
	issuer  Issuer
	wakes   <-chan listener.Wake
	log     *zap.Logger
	cfg     WorkerConfig
	metrics *Metrics
}

// NewWorker returns a worker. wakes may be nil (poll and timer only). metrics may be
// nil.
func NewWorker(q *Queue, issuer Issuer, wakes <-chan listener.Wake, log *zap.Logger, cfg WorkerConfig, metrics *Metrics) *Worker {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 30 * time.Second
	}
	return &Worker{q: q, issuer: issuer, wakes: wakes, log: log.Named("worker"), cfg: cfg, metrics: metrics}
}

// Why an order's context was cancelled.
var (
	errShutdown = errors.New("shutting down")
	errLost     = errors.New("claim lost")
)

type order struct {
	claim   Claim
	started time.Time
	cancel  context.CancelCauseFunc
}

type result struct {
	token   string
	outcome string
	// next is when this domain falls due again (its retry, or its certificate's
	// renewal), or zero.
	next time.Time
}

// minIdleRetry is the shortest gap between passes when the queue says something is
// due that the claim did not take (another instance holds it locked, say). It doubles
// while that goes on, up to the poll interval, so two disagreeing clocks can never
// make a hot loop.
const minIdleRetry = 50 * time.Millisecond

// Run works until ctx is cancelled, then stops claiming, gives in-flight orders
// ShutdownGrace, hands back what is still running, and returns nil. Database errors
// are logged and never end it: a worker that exits on a hiccup would silently stop
// issuing certificates, which is the failure this service exists to remove.
func (w *Worker) Run(ctx context.Context) error {
	w.log.Info("worker started",
		zap.String("owner", w.cfg.Owner),
		zap.Int("concurrency", w.cfg.Concurrency),
		zap.Duration("poll_interval", w.cfg.PollInterval))

	inflight := map[string]*order{}
	results := make(chan result, w.cfg.Concurrency)
	saturated := false
	var pausedUntil time.Time
	idleRetry := minIdleRetry

	timer := time.NewTimer(0)
	timerSource := listener.SourcePoll
	if w.wakes != nil {
		// The listener's first connection sends a reconnect wake: that is the
		// start-up pass.
		timer.Stop()
	}
	defer timer.Stop()
	heartbeat := time.NewTicker(w.q.cfg.Lease / 3)
	defer heartbeat.Stop()

	// claim fills the free slots. It runs in this goroutine only.
	claim := func(source string) int {
		if ctx.Err() != nil {
			return 0
		}
		pctx, cancel := context.WithTimeout(ctx, w.stepTimeout())
		until, err := w.q.CAPausedUntil(pctx, w.cfg.Directory)
		cancel()
		if err != nil {
			w.logDBError("read CA pause", err)
			return 0
		}
		pausedUntil = until
		if !until.IsZero() {
			w.log.Debug("CA paused after a rate limit", zap.Time("paused_until", until))
			return 0
		}
		n := 0
		for {
			free := w.cfg.Concurrency - len(inflight)
			if free <= 0 {
				saturated = true
				return n
			}
			cctx, cancel := context.WithTimeout(ctx, w.stepTimeout())
			claims, err := w.q.Claim(cctx, w.cfg.Owner, free)
			cancel()
			if err != nil {
				w.logDBError("claim", err)
				return n
			}
			for _, c := range claims {
				inflight[c.Token] = w.start(ctx, c, source, results)
			}
			n += len(claims)
			w.metrics.setInflight(len(inflight))
			if len(claims) < free {
				saturated = false
				return n
			}
		}
	}

	// timerAt is when the timer fires (zero: stopped); setTimer moves it.
	var timerAt time.Time
	setTimer := func(d time.Duration, source string) {
		timer.Reset(d)
		timerAt, timerSource = time.Now().Add(d), source
	}

	// schedule sets the timer for the next thing that falls due, capped by the poll.
	schedule := func(claimed int) {
		now := time.Now()
		qctx, cancel := context.WithTimeout(ctx, w.stepTimeout())
		next, err := w.q.NextDue(qctx)
		cancel()
		if err != nil {
			// Not known: look again soon rather than at the next poll, so a due
			// retry is not held up by a failed query.
			w.logDBError("compute next due time", err)
			next = now.Add(-time.Nanosecond)
		}
		if !pausedUntil.IsZero() && next.Before(pausedUntil) && !next.IsZero() {
			next = pausedUntil
		}
		delay, source := w.cfg.PollInterval, listener.SourcePoll
		if !next.IsZero() {
			d := next.Sub(now)
			switch {
			case d > 0:
				idleRetry = minIdleRetry
			case saturated:
				// Due now, but every slot is busy: a finished order claims more.
				d = w.cfg.PollInterval
			case len(w.wakes) > 0:
				// Due now, and a wake-up is already waiting (the notification of
				// the row that made it due): its pass claims it.
				d = w.cfg.PollInterval
			default:
				// Due now and not claimed: another instance holds it, or a query
				// failed. Look again, less often each time it goes on.
				d = idleRetry
				idleRetry = min(2*idleRetry, w.cfg.PollInterval)
			}
			// A few milliseconds late rather than early: the claim compares with
			// the database's clock and a strict inequality.
			if d+5*time.Millisecond < delay {
				delay, source = d+5*time.Millisecond, listener.SourceTimer
			}
		}
		setTimer(delay, source)
		w.log.Debug("pass finished", zap.Int("claimed", claimed), zap.Duration("next_in", delay),
			zap.String("next_source", source))
	}

	pass := func(source string, at time.Time) {
		w.metrics.wake(source)
		w.log.Debug("wake-up", zap.String("source", source), zap.Time("at", at))
		if source == listener.SourceNotify {
			// A notification says a row has entered the claimable set, which is
			// nearly always due now: claim before anything else, so the tenant's
			// "verify" is one query away from its claim. Reclaiming and renewals
			// belong to the timer's passes; the schedule comes after the claim, for
			// the rare row that entered the set inside a backoff.
			schedule(claim(source))
			return
		}
		timer.Stop()
		// This instance's own leases are renewed before anything is reclaimed: after
		// a database outage longer than the lease they have all run out, and the
		// reclaim would requeue orders that are alive here, charge them an attempt,
		// and let the claim below order the same domain a second time while the
		// first order still runs. If they cannot be renewed, reclaiming waits for a
		// later pass.
		if w.heartbeat(ctx, inflight) {
			w.reclaim(ctx)
		}
		rctx, cancel := context.WithTimeout(ctx, w.stepTimeout())
		if r, err := w.q.MarkRenewals(rctx); err != nil {
			w.logDBError("mark renewals", err)
		} else if r.Marked > 0 {
			w.log.Info("certificates due for renewal", zap.Int64("renewals", r.Marked), zap.String("source", source))
		}
		cancel()
		schedule(claim(source))
	}

	finish := func(r result) {
		delete(inflight, r.token)
		w.metrics.setInflight(len(inflight))
		// The finished order may have set a due time sooner than the timer's: the
		// retry after its backoff, or the renewal time of the certificate it
		// stored. It is known here, so it costs no query.
		if !r.next.IsZero() && (timerAt.IsZero() || r.next.Before(timerAt)) {
			setTimer(max(time.Until(r.next), 0)+5*time.Millisecond, listener.SourceTimer)
		}
	}

	if w.wakes == nil {
		pass(listener.SourcePoll, time.Now())
	}
	for {
		select {
		case <-ctx.Done():
			return w.shutdown(inflight, results, heartbeat.C)
		case wk := <-w.wakes:
			pass(wk.Source, wk.At)
		case <-timer.C:
			timerAt = time.Time{}
			pass(timerSource, time.Now())
		case r := <-results:
			finish(r)
			// A slot is free. While the queue was full, more may be due: claim.
			// Only when the queue runs dry is the next due time worth a query;
			// while it stays full, finishing orders keep claiming.
			if saturated {
				if n := claim(listener.SourceTimer); !saturated {
					schedule(n)
				}
			}
		case <-heartbeat.C:
			w.heartbeat(ctx, inflight)
		}
	}
}

// stepTimeout bounds one database step of a pass. The loop's goroutine also renews
// the leases, so a step that hangs (a database that stopped answering without
// closing the connection) must give up well inside a lease.
func (w *Worker) stepTimeout() time.Duration { return w.q.cfg.Lease / 4 }

// start checks the claim's name and launches its order.
func (w *Worker) start(ctx context.Context, c Claim, source string, results chan<- result) *order {
	w.metrics.claimed(c)
	o := &order{claim: c, started: time.Now()}
	// Orders are not cancelled by the shutdown signal itself: they get the grace.
	octx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	o.cancel = cancel
	fields := []zap.Field{
		zap.String("domain", c.Domain), zap.String("domain_id", c.ID),
		zap.Int("attempt", max(c.Attempts, 0)+1), zap.String("source", source),
	}
	if !c.DueAt.IsZero() {
		fields = append(fields, zap.Duration("wake_latency", c.ClaimedAt.Sub(c.DueAt)))
	}
	if c.CurrentPEM != "" {
		fields = append(fields, zap.Bool("renewal", true))
	}
	w.log.Info("order started", fields...)
	go func() {
		outcome, next := w.runOrder(octx, c)
		cancel(nil)
		w.metrics.finished(outcome, time.Since(o.started))
		results <- result{token: c.Token, outcome: outcome, next: next}
	}()
	return o
}

// runOrder issues the certificate and records the result. It returns the outcome, and
// when the domain falls due again where that is known.
func (w *Worker) runOrder(ctx context.Context, c Claim) (outcome string, next time.Time) {
	log := w.log.With(zap.String("domain", c.Domain), zap.String("domain_id", c.ID))
	attempt := max(c.Attempts, 0) + 1
	name, err := CheckName(c.Domain)
	if err != nil {
		reason := InvalidDomainPrefix + err.Error()
		log.Error("domain name cannot be issued; marked failed", zap.String("error", reason), zap.Int("attempt", attempt))
		w.record(ctx, log, "mark invalid", func(ctx context.Context) error { return w.q.MarkInvalid(ctx, c, reason) })
		return "invalid", time.Time{}
	}

	cert, err := w.issue(ctx, c, name)
	switch {
	case err == nil:
		if w.record(ctx, log, "store certificate", func(ctx context.Context) error { return w.q.MarkActive(ctx, c, cert) }) {
			log.Info("certificate issued", zap.Time("not_after", cert.NotAfter), zap.Time("renew_at", cert.RenewAt),
				zap.String("serial", cert.Serial), zap.Duration("took", time.Since(c.ClaimedAt)))
			return "issued", cert.RenewAt
		}
		return "lost", time.Time{}
	case errors.Is(context.Cause(ctx), errLost):
		log.Warn("order abandoned: the claim was lost to another instance", zap.Error(err), zap.Int("attempt", attempt))
		return "lost", time.Time{}
	case errors.Is(context.Cause(ctx), errShutdown):
		w.record(ctx, log, "hand back", func(ctx context.Context) error { return w.q.Release(ctx, c) })
		log.Info("order handed back at shutdown", zap.Int("attempt", attempt))
		return "released", time.Time{}
	}

	if rl, ok := IsRateLimit(err); ok {
		wait := rl.RetryAfter
		if wait <= 0 {
			wait = w.q.cfg.RetryBase
		}
		until := time.Now().Add(wait)
		log.Warn("rate limited by the CA; pausing every instance, not charged to the domain",
			zap.Error(err), zap.Int("attempt", attempt), zap.Time("paused_until", until))
		w.record(ctx, log, "pause CA", func(ctx context.Context) error {
			return w.q.PauseCA(ctx, w.cfg.Directory, until, rl.Detail)
		})
		w.record(ctx, log, "hand back", func(ctx context.Context) error { return w.q.Release(ctx, c) })
		return "rate_limited", until
	}

	var perm *PermanentError
	if errors.As(err, &perm) {
		log.Error("issuance failed for good; marked failed", zap.Error(err), zap.Int("attempt", attempt))
		w.record(ctx, log, "mark failed", func(ctx context.Context) error { return w.q.MarkInvalid(ctx, c, err.Error()) })
		return "invalid", time.Time{}
	}

	var f Failure
	if !w.record(ctx, log, "record failure", func(ctx context.Context) error {
		var err2 error
		f, err2 = w.q.MarkFailed(ctx, c, err.Error())
		return err2
	}) {
		return "lost", time.Time{}
	}
	if f.GaveUp {
		log.Error("giving up on issuance; run `certworker retry` after fixing the cause",
			zap.Error(err), zap.Int("attempt", f.Attempts))
		return "gave_up", time.Time{}
	}
	log.Warn("issuance failed, will retry", zap.Error(err), zap.Int("attempt", f.Attempts),
		zap.Duration("retry_in", f.RetryIn))
	// The backoff counts from the claim, as the claim query does.
	return "failed", c.ClaimedAt.Add(f.RetryIn)
}

// issue calls the issuer, turning a panic into an error: nothing about the CA,
// however it misbehaves, may crash the worker or leave a domain in provisioning.
func (w *Worker) issue(ctx context.Context, c Claim, name string) (cert *Certificate, err error) {
	defer func() {
		if p := recover(); p != nil {
			w.log.Error("issuer panicked", zap.String("domain", c.Domain), zap.String("domain_id", c.ID),
				zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
			err = fmt.Errorf("internal error: issuer panicked: %v", p)
		}
	}()
	cert, err = w.issuer.Issue(ctx, Request{DomainID: c.ID, Domain: name, CurrentPEM: c.CurrentPEM})
	if err == nil && cert == nil {
		err = errors.New("internal error: issuer returned no certificate and no error")
	}
	return cert, err
}

// record runs a write that finishes an order, retrying through a database hiccup for
// up to one lease (after that another instance will have reclaimed the row anyway).
// It reports whether the write happened; a lost claim is logged and not retried.
func (w *Worker) record(ctx context.Context, log *zap.Logger, what string, write func(context.Context) error) bool {
	ctx = context.WithoutCancel(ctx)
	deadline := time.Now().Add(w.q.cfg.Lease)
	delay := 200 * time.Millisecond
	for {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := write(wctx)
		cancel()
		if err == nil {
			return true
		}
		if errors.Is(err, ErrClaimLost) {
			log.Warn("result dropped: the claim was lost to another instance", zap.String("step", what))
			return false
		}
		if time.Now().Add(delay).After(deadline) {
			log.Error("could not record the result; the lease will run out and the domain be requeued",
				zap.String("step", what), zap.Error(err))
			return false
		}
		log.Warn("could not record the result, retrying", zap.String("step", what), zap.Error(err),
			zap.Duration("retry_in", delay))
		time.Sleep(delay)
		delay = min(2*delay, 5*time.Second)
	}
}

func (w *Worker) reclaim(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, w.stepTimeout())
	defer cancel()
	reclaimed, err := w.q.ReclaimAbandoned(ctx)
	if err != nil {
		w.logDBError("reclaim abandoned", err)
		return
	}
	for _, r := range reclaimed {
		w.log.Warn("domain was left mid-issuance by an instance that stopped; requeued",
			zap.String("domain", r.Domain), zap.String("domain_id", r.ID),
			zap.String("error", interruptedError), zap.Int("attempt", r.Attempts), zap.Bool("gave_up", r.GaveUp))
	}
}

// heartbeat renews this instance's leases and stops the orders whose claim is gone.
// It reports false when the leases could not be renewed.
func (w *Worker) heartbeat(ctx context.Context, inflight map[string]*order) bool {
	if len(inflight) == 0 {
		return true
	}
	tokens := make([]string, 0, len(inflight))
	for t := range inflight {
		tokens = append(tokens, t)
	}
	ctx, cancel := context.WithTimeout(ctx, w.stepTimeout())
	defer cancel()
	lost, err := w.q.Heartbeat(ctx, tokens)
	if err != nil {
		w.logDBError("renew leases", err)
		return false
	}
	for _, t := range lost {
		if o := inflight[t]; o != nil {
			w.log.Warn("claim lost: another instance requeued this domain; stopping the order",
				zap.String("domain", o.claim.Domain), zap.String("domain_id", o.claim.ID))
			o.cancel(errLost)
		}
	}
	return true
}

// shutdown waits for in-flight orders up to the grace, then cancels the rest, which
// hand their claims back. An issuer that ignores cancellation gets a little longer;
// then its claims are handed back from here and its late result is dropped.
func (w *Worker) shutdown(inflight map[string]*order, results <-chan result, heartbeat <-chan time.Time) error {
	if len(inflight) > 0 {
		w.log.Info("stopping: waiting for orders in flight", zap.Int("orders", len(inflight)),
			zap.Duration("grace", w.cfg.ShutdownGrace))
	}
	grace := time.NewTimer(w.cfg.ShutdownGrace)
	defer grace.Stop()
	wait := func(stop <-chan time.Time) {
		for len(inflight) > 0 {
			select {
			case r := <-results:
				delete(inflight, r.token)
			case <-heartbeat:
				// Orders finishing inside the grace keep their leases.
				w.heartbeat(context.Background(), inflight)
			case <-stop:
				return
			}
		}
	}
	wait(grace.C)
	if len(inflight) > 0 {
		w.log.Warn("shutdown grace over: handing back orders still running", zap.Int("orders", len(inflight)))
		for _, o := range inflight {
			o.cancel(errShutdown)
		}
		wait(time.After(10 * time.Second))
	}
	for _, o := range inflight {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := w.q.Release(ctx, o.claim); err != nil && !errors.Is(err, ErrClaimLost) {
			w.log.Error("could not hand back a claim; its lease will run out", zap.String("domain", o.claim.Domain),
				zap.String("domain_id", o.claim.ID), zap.Error(err))
		}
		cancel()
	}
	w.metrics.setInflight(0)
	w.log.Info("worker stopped")
	return nil
}

// logDBError logs a failed step of a pass. A cancelled context at shutdown is not an
// error.
func (w *Worker) logDBError(step string, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	w.log.Warn("database step failed; will try again on the next wake-up", zap.String("step", step), zap.Error(err))
}
