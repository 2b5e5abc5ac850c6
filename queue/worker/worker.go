package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// ErrStarted is returned by Start on a worker that has been started before.
var ErrStarted = errors.New("worker: already started")

// Worker claims due domains and runs their orders, driven by wake-ups.
type Worker struct {
	cfg   Config
	q     Store
	log   *zap.Logger
	m     *metrics
	waker listener.Waker
	// topics is the topics' own listening connection under --wake logical, or nil.
	topics *listener.Listener
	// owner is cfg.Owner and a random suffix, unique to this worker (ReleaseUntracked).
	owner string

	orders  *orderSet      // in flight; the loop adds, the heartbeat reads
	hb      heartbeatConn  // the heartbeat's own session; only its goroutine uses it
	results chan result    // one per order; buffered, so an order never waits for the loop
	kick    chan string    // a pass wanted now (after maintenance queued something)
	maintAt chan nextMaint // a maintenance run wanted (a certificate's renewal), and how it was learned
	health  dbHealth
	// first is the CA at cfg.Directory; second is cfg.Fallback's, or nil.
	first, second *ca
	// keyErr is set by the first order that found a stored key it cannot open (Halted).
	keyErr atomic.Pointer[issuing.KeyError]
	// profileErr is set when the CA does not offer --acme-profile; like keyErr.
	profileErr atomic.Pointer[issuing.ProfileError]
	// lastHousekeeping is only the maintenance goroutine's.
	lastHousekeeping time.Time
	// hard is closed when the shutdown stops waiting: finishing writes stop retrying.
	hard chan struct{}
	// notSent are claims whose Admit may have committed unseen (settleNotSent).
	notSent []notSent

	loopState

	startOnce sync.Once
	done      chan struct{} // closed when Run's work is over
	err       error
}

// New checks cfg and returns a worker. It does not connect: Start does.
func New(cfg Config) (*Worker, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	var suffix [3]byte
	_, _ = rand.Read(suffix[:])
	log := cfg.Log.Named("worker")
	var db queue.DB = cfg.Pool
	if cfg.DB != nil {
		db = cfg.DB
	}
	w := &Worker{
		cfg:     cfg,
		q:       queue.New(db, cfg.Queue),
		log:     log,
		m:       newMetrics(cfg.Registerer),
		owner:   cfg.Owner + "/" + hex.EncodeToString(suffix[:]),
		orders:  newOrderSet(),
		hb:      heartbeatConn{cfg: cfg.Pool.Config()},
		results: make(chan result, cfg.Concurrency),
		kick:    make(chan string, 1),
		maintAt: make(chan nextMaint, 1),
		hard:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	w.health = newDBHealth(cfg.Queue.Lease)
	w.first = &ca{label: "primary", directory: cfg.Directory, issuer: cfg.Issuer, limits: cfg.Limits}
	if f := cfg.Fallback; f != nil {
		w.second = &ca{label: "fallback", directory: f.Directory, issuer: f.Issuer, limits: f.Limits}
	}
	opts := cfg.WakeOptions
	opts.Registerer = cfg.Registerer
	if cfg.Wake == issuing.WakeLogical {
		w.waker = listener.NewLogical(cfg.Pool, cfg.Log, opts)
		if len(cfg.Topics) > 0 {
			// The topics' connection exports no metrics of its own.
			topicOpts := opts
			topicOpts.Registerer, topicOpts.Replication = nil, nil
			w.topics = listener.New(cfg.Pool, cfg.Log, topicOpts)
			listenAll(w.topics, cfg.Topics)
		}
	} else {
		l := listener.New(cfg.Pool, cfg.Log, opts)
		listenAll(l, cfg.Topics)
		w.waker = l
	}
	return w, nil
}

// Start connects the wake source and returns its error (then nothing is left
// running), records the fleet's settings, and runs the worker until ctx ends, then
// shuts down (grace, hand-back, wake source); Wait returns once done.
func (w *Worker) Start(ctx context.Context) error {
	err := ErrStarted
	w.startOnce.Do(func() { err = w.launch(ctx) })
	return err
}

func (w *Worker) launch(ctx context.Context) error {
	w.warmPool(ctx)
	if err := w.waker.Start(ctx); err != nil {
		close(w.done)
		return fmt.Errorf("listen for wake-ups: %w", err)
	}
	if w.topics != nil {
		if err := w.topics.Start(ctx); err != nil {
			w.waker.Stop()
			close(w.done)
			return fmt.Errorf("listen for %s: %w", strings.Join(slices.Sorted(maps.Keys(w.cfg.Topics)), ", "), err)
		}
	}
	// After the wake source is up, so a --wake logical that cannot start does not
	// silence the trigger for others; before the first pass, which covers the switch.
	if err := w.recordSettings(ctx); err != nil {
		w.stopListening()
		close(w.done)
		return err
	}
	w.log.Info("worker started", zap.String("owner", w.owner), zap.Int("concurrency", w.cfg.Concurrency),
		zap.Duration("poll_interval", w.cfg.PollInterval), zap.String("wake", w.cfg.Wake),
		zap.Duration("lease", w.cfg.Queue.Lease), zap.Duration("order_timeout", w.cfg.OrderTimeout))
	go w.run(ctx)
	return nil
}

// warmPool has the pool open and warm the connections the worker may use at once
// before the wake source starts, off the path of the first verifies. Not MinConns:
// its background connects hold the pool's slots during a failover. Best effort,
// within one step's bound. The connections are opened and warmed at once, so on a
// busy server start-up waits for the slowest warm-up, not for their sum. Once the
// server has given one, a connection it could not give (a connect past its timeout,
// say) is tried again every warmRetry, and what is still missing when the bound runs
// out is opened on first use. A server that gives none is not asked again: the wake
// source's connect comes next, and fails Start at once with the reason.
func (w *Worker) warmPool(ctx context.Context) {
	// The loop, the maintenance, the renewal-information reads and the DNS waits.
	const warmHelpers = 4
	n := min(int(w.cfg.Pool.Config().MaxConns), w.cfg.Concurrency+warmHelpers)
	ctx, cancel := w.step(ctx, false)
	defer cancel()
	held := make([]*pgxpool.Conn, n)
	errs := make([]error, n)
	defer func() {
		for _, c := range held {
			if c != nil {
				c.Release()
			}
		}
	}()
	acquire := func(i int) bool {
		held[i], errs[i] = w.cfg.Pool.Acquire(ctx)
		return errs[i] == nil
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { acquire(i) })
	}
	wg.Wait()
	if slices.ContainsFunc(held, func(c *pgxpool.Conn) bool { return c != nil }) {
		for i := range n {
			if held[i] != nil {
				continue
			}
			wg.Go(func() {
				for {
					select {
					case <-ctx.Done():
						return
					case <-time.After(warmRetry):
					}
					if acquire(i) {
						return
					}
				}
			})
		}
		wg.Wait()
	}
	warmed, lastErr := 0, error(nil)
	for i := range n {
		if held[i] != nil {
			warmed++
		} else {
			lastErr = errs[i]
		}
	}
	if warmed < n {
		w.log.Info("pool warm-up incomplete; the other connections are opened and warmed on first use",
			zap.Int("warmed", warmed), zap.Int("wanted", n), zap.Error(lastErr))
	}
}

// warmRetry is how long the pool's warm-up waits before it tries again to open a
// connection that failed.
const warmRetry = 100 * time.Millisecond

// Wait blocks until the worker has stopped, and returns nil: database errors never
// end it, since a worker that exits on a hiccup silently stops issuing.
func (w *Worker) Wait() error {
	<-w.done
	return w.err
}

// Run is Start, then Wait.
func (w *Worker) Run(ctx context.Context) error {
	if err := w.Start(ctx); err != nil {
		return err
	}
	return w.Wait()
}

// Ready reports whether the wake source holds a live connection (/readyz).
func (w *Worker) Ready() bool { return w.waker.Connected() }

// Halted is the error that stopped this instance claiming (*issuing.KeyError or
// *ProfileHalt), or nil; /readyz answers 503 with it.
func (w *Worker) Halted() error {
	if ke := w.keyErr.Load(); ke != nil {
		return ke
	}
	if pe := w.profileErr.Load(); pe != nil {
		return &ProfileHalt{Err: pe}
	}
	return nil
}

// ProfileHalt is Halted's error when the CA does not offer --acme-profile.
type ProfileHalt struct{ Err *issuing.ProfileError }

func (e *ProfileHalt) Error() string {
	return "--acme-profile: " + e.Err.Error() + "; stopped claiming until restarted with a profile the CA offers"
}
func (e *ProfileHalt) Unwrap() error { return e.Err }

func (w *Worker) halted() bool { return w.keyErr.Load() != nil || w.profileErr.Load() != nil }

// Owner is the name this instance claims under (ssl_claimed_by).
func (w *Worker) Owner() string { return w.owner }

func (w *Worker) run(ctx context.Context) {
	defer close(w.done)
	defer w.stopListening()
	// The heartbeat outlives the loop, for orders finishing in the shutdown grace.
	hbCtx, stopHeartbeat := context.WithCancel(context.WithoutCancel(ctx))
	var helpers sync.WaitGroup
	helpers.Go(func() { w.heartbeatLoop(hbCtx) })
	helpers.Go(func() { w.maintenanceLoop(ctx) })
	helpers.Go(func() { w.renewalInfoLoop(ctx) })
	helpers.Go(func() { w.dnsWaitLoop(ctx) })

	w.loop(ctx)
	w.shutdown()
	stopHeartbeat()
	helpers.Wait()
	w.log.Info("worker stopped")
}

// loop is the worker's one goroutine that claims: every wake-up and every finished
// order comes through here, so the claim and the timer need no lock.
func (w *Worker) loop(ctx context.Context) {
	w.timer = time.NewTimer(time.Hour)
	w.timer.Stop() // the wake source's start-up wake-up runs the first pass
	defer w.timer.Stop()
	wakes := w.waker.Wakes()
	for {
		select {
		case <-ctx.Done():
			return
		case wk := <-wakes:
			w.pass(ctx, wk.Source, wk.At)
		case <-w.timer.C:
			w.timerAt = time.Time{}
			w.pass(ctx, w.timerSource, time.Now())
		case source := <-w.kick:
			w.pass(ctx, source, time.Now())
		case r := <-w.results:
			w.finished(ctx, r)
		}
	}
}

// startTimeout bounds each statement Start runs. Nothing is leased yet, so the bound is
// not the lease's: a database slow to answer its first statements (a server just
// started, cold caches, a busy host) must not fail the start under a short lease.
const startTimeout = 10 * time.Second

// stepTimeout bounds one database statement of the loop, the heartbeat or the
// maintenance, so a hung statement gives up well inside a lease.
func (w *Worker) stepTimeout() time.Duration { return w.cfg.Queue.Lease / 4 }

// step is a context for one statement, ending after stepTimeout; noCancel detaches
// it from ctx's end. A statement still running at its end is given as long again
// (the session's statement_timeout, WorkerSession's quarter lease) for the server to
// end it, so the session is kept (queue.WithDeadlineGrace).
func (w *Worker) step(ctx context.Context, noCancel bool) (context.Context, context.CancelFunc) {
	if noCancel {
		ctx = context.WithoutCancel(ctx)
	}
	return context.WithTimeout(queue.WithDeadlineGrace(ctx), w.stepTimeout())
}

// logDBError logs a failed step. A cancelled context at shutdown is not an error.
func (w *Worker) logDBError(step string, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	w.log.Warn("database step failed; will try again", zap.String("step", step), zap.Error(err))
}

// recordSettings writes this instance's wake mode and fleet settings, logging a
// change.
func (w *Worker) recordSettings(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, max(w.stepTimeout(), startTimeout))
	defer cancel()
	prev, err := w.q.SetWakeMode(ctx, w.cfg.Wake)
	if err != nil {
		return fmt.Errorf("wake mode %s: %w", w.cfg.Wake, err)
	}
	if prev != w.cfg.Wake {
		w.log.Warn("wake mode changed for every instance on this database; instances still running with the old mode wake only on their timer and poll until restarted with the new one",
			zap.String("from", prev), zap.String("to", w.cfg.Wake))
	}
	mine := queue.FleetSettings{RetryBase: w.cfg.Queue.RetryBase, RetryMax: w.cfg.Queue.RetryMax,
		MaxAttempts: w.cfg.Queue.MaxAttempts, Limits: w.cfg.Limits}
	old, ok, err := w.q.RecordSettings(ctx, mine)
	if err != nil {
		return err
	}
	if ok && old != mine {
		w.log.Warn("fleet settings changed by this instance; the ledger's limits apply to every instance at once, and `status` reports by these settings",
			zap.Any("from", settingsFields(old)), zap.Any("to", settingsFields(mine)))
	}
	return nil
}

func settingsFields(s queue.FleetSettings) map[string]string {
	return map[string]string{
		"retry_base": s.RetryBase.String(), "retry_max": s.RetryMax.String(),
		"max_attempts":                      fmt.Sprint(s.MaxAttempts),
		"limit_orders_per_account":          s.Limits.OrdersPerAccount.String(),
		"limit_certs_per_registered_domain": s.Limits.CertsPerRegisteredDomain.String(),
		"limit_certs_per_exact_set":         s.Limits.CertsPerExactSet.String(),
		"limit_failed_authz_per_name":       s.Limits.FailedAuthzPerName.String(),
		"limit_tenant_reserve":              strconv.FormatFloat(s.Limits.TenantReserve*100, 'f', -1, 64) + "%",
	}
}

func listenAll(l *listener.Listener, topics map[string]listener.Topic) {
	for channel, t := range topics {
		l.Listen(channel, t)
	}
}

func (w *Worker) stopListening() {
	w.waker.Stop()
	if w.topics != nil {
		w.topics.Stop()
	}
}
