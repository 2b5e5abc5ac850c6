package worker

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// Why an order's context was cancelled (context.Cause).
var (
	errShutdown      = errors.New("shutting down")
	errLost          = errors.New("claim lost")
	errOrderTimeout  = errors.New("order timed out")
	errLeaseDeadline = fmt.Errorf("lease not renewed in time: %w", issuing.ErrLeaseDeadline)
)

type order struct {
	claim   issuing.Claim
	source  string
	started time.Time
	cancel  context.CancelCauseFunc
	// deadline is the claim's local lease deadline, moved by the heartbeat.
	deadline *issuing.Deadline
	// lost is set by the heartbeat when the claim is gone; finishing writes stop then.
	lost atomic.Bool
	// finishing is set when the order starts the write that ends its claim (store,
	// fail, failForGood, handBack, waitForDNS, and refuseProfile until it answers
	// that the order goes on): from then on its token may be gone
	// because that write committed, so only the write, under the token, tells whether
	// the claim was lost. Writes after which the order goes on do not set it.
	finishing atomic.Bool
}

type result struct {
	token   string
	outcome string
	// retryIn is when the domain falls due again (its backoff), or 0.
	retryIn time.Duration
	// authzFailed: the order failed because its authorization did (for the ledger).
	authzFailed bool
	// issued: the CA issued a certificate, stored or not (the ledger counts it).
	issued bool
}

// orderSet is the orders in flight, by token: the loop writes, the heartbeat reads.
type orderSet struct {
	mu sync.Mutex
	m  map[string]*order
}

func newOrderSet() *orderSet { return &orderSet{m: map[string]*order{}} }

func (s *orderSet) add(o *order) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[o.claim.Token] = o
}

func (s *orderSet) remove(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, token)
}

func (s *orderSet) get(token string) *order {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[token]
}

func (s *orderSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// firstIssuances is how many orders in flight are first issuances or their retries.
func (s *orderSet) firstIssuances() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, o := range s.m {
		if o.claim.FirstIssuance {
			n++
		}
	}
	return n
}

func (s *orderSet) tokens() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.m))
	for t := range s.m {
		out = append(out, t)
	}
	return out
}

func (s *orderSet) all() []*order {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*order, 0, len(s.m))
	for _, o := range s.m {
		out = append(out, o)
	}
	return out
}

// start runs the order for a claim in its own goroutine; its lease deadline runs
// from sent.
func (w *Worker) start(ctx context.Context, c issuing.Claim, source string, sent time.Time) {
	o := &order{claim: c, source: source, started: time.Now(), deadline: issuing.NewDeadline(sent, w.cfg.Queue.Lease)}
	// Orders are not cancelled by the shutdown signal itself: they get the grace.
	octx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	o.cancel = cancel
	w.orders.add(o)
	w.m.claimed(c, source)
	w.m.setInflight(w.orders.len())
	fields := []zap.Field{
		issuing.LogDomain(c.Domain, c.ID, c.TenantID),
		zap.Int("attempt", max(c.Attempts, 0)+1), zap.String("source", source),
	}
	if !c.DueAt.IsZero() {
		fields = append(fields, zap.Duration("wake_latency", c.ClaimedAt.Sub(c.DueAt)))
	}
	if c.CurrentPEM != "" {
		fields = append(fields, zap.Bool("renewal", true))
	}
	if w.second != nil {
		fields = append(fields, zap.String("ca", w.caOf(c.Directory).label))
	}
	w.log.Info("order started", fields...)
	go func() {
		// This ends the waits between the issuer's requests.
		dctx, stopDeadline := o.deadline.Bound(octx)
		r := w.runOrder(dctx, o)
		stopDeadline()
		cancel(nil)
		w.settleLedger(o, r)
		w.m.outcome(r.outcome, time.Since(o.started))
		w.m.caOrder(w.caOf(c.Directory).label, r.outcome)
		w.results <- r
	}()
}

// runOrder checks the name, places the order under --order-timeout, and records
// the outcome.
func (w *Worker) runOrder(ctx context.Context, o *order) result {
	c := o.claim
	log := w.log.With(issuing.LogDomain(c.Domain, c.ID, c.TenantID))
	res := result{token: c.Token}
	name, err := issuing.CheckNameFor(c.Domain, w.cfg.Wildcards)
	if err != nil {
		res.outcome = w.failForGood(o, log, issuing.InvalidDomainPrefix+err.Error(), "invalid")
		return res
	}
	octx, cancel := context.WithTimeoutCause(ctx, w.cfg.OrderTimeout, errOrderTimeout)
	defer cancel()
	if outcome, retryIn, done := w.checkCAA(octx, o, log, name); done {
		res.outcome, res.retryIn = outcome, retryIn
		return res
	}
	w.logFallback(c, log)
	var cert *issuing.Certificate
	if at := w.caOf(c.Directory); at == w.first {
		cert, err = w.issueUnderProfile(octx, o, log, name)
	} else {
		// The second CA orders under its own --acme-fallback-profile.
		cert, err = w.issue(octx, o, name, "")
		var pe *issuing.ProfileError
		if errors.As(err, &pe) {
			err = fallbackProfileError(pe)
		}
	}
	if err == nil {
		res.issued = true
		res.outcome = w.store(o, log, cert)
		return res
	}
	var settled *errProfileSettled
	switch cause := context.Cause(octx); {
	case errors.As(err, &settled):
		res.outcome = settled.outcome
	case errors.Is(cause, errLost):
		log.Warn("order abandoned: the claim was lost to another instance", zap.Error(err),
			zap.Int("attempt", max(c.Attempts, 0)+1))
		res.outcome = "lost"
	case errors.Is(cause, issuing.ErrLeaseDeadline), errors.Is(err, issuing.ErrLeaseDeadline):
		// Another instance may have reclaimed the row; the claim goes back uncharged if
		// still ours.
		log.Warn("order stopped at its lease deadline: the lease could not be renewed in time; nothing more is sent to the CA, and the claim is handed back uncharged once the database answers",
			zap.Error(err), zap.Int("attempt", max(c.Attempts, 0)+1))
		res.outcome = w.handBack(o, log, false, "lease_deadline")
	case errors.Is(cause, errShutdown):
		res.outcome = w.handBack(o, log, false, "released")
		log.Info("order handed back at shutdown", zap.Int("attempt", max(c.Attempts, 0)+1))
	case errors.Is(cause, errOrderTimeout):
		reason := fmt.Sprintf("order timed out after %s (--order-timeout): the CA answered, but the order did not finish", w.cfg.OrderTimeout)
		res.outcome, res.retryIn = w.fail(o, log, reason, "timeout")
	default:
		res.outcome, res.retryIn = w.failed(o, log, name, err)
		res.authzFailed = issuing.IsAuthorizationFailure(err)
	}
	return res
}

// issue calls the issuer, turning a panic into an error, so no CA can crash the
// worker or leave a domain in provisioning.
func (w *Worker) issue(ctx context.Context, o *order, name, profile string) (cert *issuing.Certificate, err error) {
	c := o.claim
	defer func() {
		if p := recover(); p != nil {
			w.log.Error("issuer panicked", issuing.LogDomain(c.Domain, c.ID, c.TenantID),
				zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
			err = fmt.Errorf("internal error: issuer panicked: %v", p)
		}
	}()
	at := w.caOf(c.Directory)
	req := issuing.Request{DomainID: c.ID, TenantID: c.TenantID, Domain: name, CurrentPEM: w.replacesPEM(c),
		Profile: profile, Deadline: o.deadline, ClaimToken: c.Token,
		ConfirmClaim: func(ctx context.Context) error { return w.confirmClaim(ctx, o) }}
	if req.CurrentPEM != "" && at.limits.Any() {
		req.Readmit = func(ctx context.Context) error { return w.readmit(ctx, at, c, name) }
	}
	cert, err = at.issuer.Issue(issuing.WithDomainRef(ctx, issuing.DomainRef{ID: c.ID, TenantID: c.TenantID}), req)
	if err == nil && cert != nil {
		cert.Directory = at.directory
		if at != w.first {
			// A second CA's certificate records no profile, so it is never replaced for one.
			cert.Profile = ""
		}
	}
	if err == nil && cert == nil {
		err = errors.New("internal error: issuer returned no certificate and no error")
	}
	return cert, err
}

func (w *Worker) store(o *order, log *zap.Logger, cert *issuing.Certificate) string {
	o.finishing.Store(true)
	var renewIn time.Duration
	// Before the first try: a retry only widens the aim's bracket (nextMaint).
	readAt := time.Now()
	err := w.record(o, log, "store certificate", func(ctx context.Context) (err error) {
		renewIn, err = w.q.MarkActive(ctx, o.claim, cert)
		return err
	})
	readDone := time.Now()
	if outcome, done := w.notRecorded(o, log, err); done {
		return outcome
	}
	w.caAnswered(w.caOf(o.claim.Directory))
	w.wantMaintenance(aimIn(renewIn, readAt, readDone, "certificate stored"))
	log.Info("certificate issued", zap.String("directory", cert.Directory), zap.Time("not_after", cert.NotAfter), zap.Time("renew_at", cert.RenewAt),
		zap.String("serial", cert.Serial), zap.String("profile", cert.Profile), zap.Duration("took", time.Since(o.started)))
	return "issued"
}

// unstorableReason is the ssl_error recorded when the database refused the failure's
// own text; the log has the CA's words.
const unstorableReason = "the order failed, and its error could not be recorded as it was (the database refused its text); the details are in certworker's log"

// fail charges a failure to the domain (recordOr).
func (w *Worker) fail(o *order, log *zap.Logger, reason, outcome string) (string, time.Duration) {
	o.finishing.Store(true)
	var f issuing.Failure
	err := w.recordOr(o, log, "record failure", reason, func(ctx context.Context, reason string) (err error) {
		f, err = w.q.MarkFailed(ctx, o.claim, reason)
		return err
	})
	if outcome, done := w.notRecorded(o, log, err); done {
		return outcome, 0
	}
	if f.GaveUp {
		log.Error("giving up on issuance; run `certworker retry` after fixing the cause",
			zap.String("error", reason), zap.Int("attempt", f.Attempts))
		return "gave_up", 0
	}
	log.Warn("issuance failed, will retry", zap.String("error", reason), zap.Int("attempt", f.Attempts),
		zap.Duration("retry_in", f.RetryIn))
	return outcome, f.RetryIn
}

// failForGood marks the domain failed at once: no retry can fix it.
func (w *Worker) failForGood(o *order, log *zap.Logger, reason, outcome string) string {
	o.finishing.Store(true)
	err := w.recordOr(o, log, "mark failed", reason, func(ctx context.Context, reason string) error {
		return w.q.MarkPermanent(ctx, o.claim, reason)
	})
	if outcome, done := w.notRecorded(o, log, err); done {
		return outcome
	}
	log.Error("issuance cannot succeed; marked failed until `certworker retry`", zap.String("error", reason),
		zap.Int("attempt", max(o.claim.Attempts, 0)+1))
	return outcome
}

func (w *Worker) handBack(o *order, log *zap.Logger, quiet bool, outcome string) string {
	o.finishing.Store(true)
	err := w.record(o, log, "hand back", func(ctx context.Context) error {
		if reason, ok := heldReasons[outcome]; ok {
			return w.q.Hold(ctx, o.claim, quiet, reason)
		}
		return w.q.Release(ctx, o.claim, quiet)
	})
	if outcome, done := w.notRecorded(o, log, err); done {
		return outcome
	}
	return outcome
}

// heldReasons are the hand-backs that a pause causes, which the domain's history
// records as held, by the reason code it gives them (docs/domain-status.md).
var heldReasons = map[string]string{
	"ledger_held":      "rate_limited",
	"rate_limited":     "rate_limited",
	"already_replaced": "rate_limited",
	"ca_unavailable":   "ca_unavailable",
}

// notRecorded turns a write that did not happen into the order's outcome.
func (w *Worker) notRecorded(o *order, log *zap.Logger, err error) (string, bool) {
	switch {
	case err == nil:
		return "", false
	case errors.Is(err, issuing.ErrNotACME):
		ctx, cancel := w.step(context.Background(), true)
		defer cancel()
		if _, derr := w.q.Disown(ctx, o.claim); derr != nil {
			w.logDBError("drop the claim of a domain no longer acme", derr)
		}
		log.Warn("result dropped: the domain's provider is no longer acme")
		return "not_acme", true
	case errors.Is(err, issuing.ErrClaimLost), errors.Is(err, errLost):
		log.Warn("result dropped: the claim was lost to another instance")
		return "lost", true
	}
	log.Error("could not record the result; the lease will run out and the domain be requeued", zap.Error(err))
	return "unrecorded", true
}

// recordOr is record for a write of reason as ssl_error, made once more with
// unstorableReason if the database refuses it; failing that, the reclaim charges it.
func (w *Worker) recordOr(o *order, log *zap.Logger, what, reason string, write func(context.Context, string) error) error {
	err := w.record(o, log, what, func(ctx context.Context) error { return write(ctx, reason) })
	var unstorable *unstorableError
	if !errors.As(err, &unstorable) {
		return err
	}
	return w.record(o, log, what+" (generic reason)", func(ctx context.Context) error { return write(ctx, unstorableReason) })
}

// unstorableError is a finishing write the database refused deterministically.
type unstorableError struct{ err error }

func (e *unstorableError) Error() string { return "result not recordable: " + e.err.Error() }
func (e *unstorableError) Unwrap() error { return e.err }

// deterministic reports whether the database refused err's statement for what it
// holds, every time: class 22 (data) or 23 (integrity).
func deterministic(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && (strings.HasPrefix(pg.Code, "22") || strings.HasPrefix(pg.Code, "23"))
}

// record runs a finishing write until it succeeds, the claim is lost, or the
// shutdown stops waiting, through an outage of any length: the token fences it. A
// deterministic refusal is not retried (*unstorableError).
func (w *Worker) record(o *order, log *zap.Logger, what string, write func(context.Context) error) error {
	delay := 200 * time.Millisecond
	for {
		ctx, cancel := w.step(context.Background(), true)
		err := write(ctx)
		cancel()
		switch {
		case err == nil:
			w.health.ok()
			return nil
		case errors.Is(err, issuing.ErrClaimLost), errors.Is(err, issuing.ErrNotACME):
			w.health.ok()
			return err
		case o.lost.Load():
			return errLost
		case deterministic(err):
			// Retrying would hold the slot, and the lease, for ever.
			w.health.ok()
			log.Error("could not record the result: the database refuses it as it is; not retried",
				zap.String("step", what), zap.Error(err))
			return &unstorableError{err: err}
		}
		w.health.failed(err)
		log.Warn("could not record the result, retrying", zap.String("step", what), zap.Error(err),
			zap.Duration("retry_in", delay))
		select {
		case <-time.After(delay):
		case <-w.hard:
			return err
		}
		delay = min(2*delay, 2*time.Second)
	}
}
