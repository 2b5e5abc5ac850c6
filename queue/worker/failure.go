package worker

import (
	"context"
	"errors"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"go.uber.org/zap"
)

// The CA's own backoff while unreachable: short at first, and short enough at most
// that domains due are issued within a minute of its return.
const (
	unreachableBase = 2 * time.Second
	unreachableMax  = 30 * time.Second
)

// failed records what an issuer's error means for the domain (issuing.Issuer), and
// returns the outcome and when the domain falls due again.
func (w *Worker) failed(o *order, log *zap.Logger, name string, err error) (string, time.Duration) {
	attempt := zap.Int("attempt", max(o.claim.Attempts, 0)+1)
	var unavailable *issuing.CAUnavailableError
	var perm *issuing.PermanentError
	var preflight *issuing.PreflightError
	var keyErr *issuing.KeyError
	if errors.As(err, &keyErr) {
		return w.keyMissing(o, log, keyErr), 0
	}
	var held *issuing.LedgerRefusedError
	if errors.As(err, &held) {
		// The ledger's pause holds the domain, uncharged.
		log.Info("order held back by the ledger: without \"replaces\" it is a new order, which the CA would refuse; the domain waits, not charged",
			zap.String("reason", held.Reason), zap.String("ca", w.caOf(o.claim.Directory).label))
		return w.handBack(o, log, true, "ledger_held"), 0
	}
	var waiting *issuing.WaitingError
	if errors.As(err, &waiting) {
		// Nothing reached the CA: the name waits for its DNS, uncharged.
		return w.waitForDNS(o, log, waiting), 0
	}
	var dbDown *issuing.DatabaseUnavailableError
	if errors.As(err, &dbDown) {
		// Nothing reached the CA: says nothing of the CA, nor of the domain.
		w.health.failed(dbDown.Err)
		log.Warn("order not placed: the database gave no answer before anything was sent to the CA; handed back, not charged",
			zap.Error(err))
		return w.handBack(o, log, false, "released"), 0
	}
	at := w.caOf(o.claim.Directory)
	var refused *issuing.ReplacesRefusedError
	if errors.As(err, &refused) {
		w.caAnswered(at)
		return w.replacesRefused(o, log, name, refused)
	}
	if rl, ok := issuing.IsRateLimit(err); ok {
		w.caAnswered(at)
		return w.rateLimited(o, log, name, rl)
	}
	switch {
	case errors.As(err, &unavailable):
		return w.caUnreachable(o, log, err)
	case errors.As(err, &perm):
		w.caAnswered(at)
		if outcome, ok := w.refusedByFirst(o, log, perm); ok {
			return outcome, 0
		}
		if outcome, ok := w.refusedBySecond(o, log, perm); ok {
			return outcome, 0
		}
		return w.failForGood(o, log, err.Error(), "permanent"), 0
	case errors.As(err, &preflight):
		// Nothing reached the CA, so this says nothing of its reach.
		return w.fail(o, log, err.Error(), "preflight_failed")
	}
	w.caAnswered(at)
	log.Debug("order failed", zap.Error(err), attempt)
	return w.fail(o, log, err.Error(), "failed")
}

// rateLimited pauses what the CA's limit covers until its Retry-After (--retry-base
// when none) and hands the claim back uncharged; it returns the pause's length.
func (w *Worker) rateLimited(o *order, log *zap.Logger, name string, rl *issuing.RateLimitError) (string, time.Duration) {
	at := w.caOf(o.claim.Directory)
	scope, key := rl.Scope, at.directory
	switch scope {
	case issuing.ScopeRegisteredDomain:
		key = issuing.RegisteredDomain(name)
	case issuing.ScopeDomain:
		key = name
	default:
		scope = issuing.ScopeCA
	}
	wait := rl.RetryAfter
	if wait <= 0 {
		wait = w.cfg.Queue.RetryBase
	}
	var until time.Duration
	err := w.record(o, log, "pause", func(ctx context.Context) (err error) {
		until, err = w.q.PauseAt(ctx, at.directory, scope, key, issuing.PauseRateLimit, wait, rl.Detail)
		return err
	})
	if err != nil {
		log.Error("could not record the CA's rate limit", zap.Error(err))
	}
	log.Warn("rate limited by the CA; paused for every instance, not charged to the domain",
		zap.String("error", rl.Error()), zap.String("scope", scope), zap.String("key", key),
		zap.String("limit", rl.Limit), zap.Duration("paused_for", until), zap.String("ca", at.label))
	return w.handBack(o, log, false, "rate_limited"), until
}

// replacesRefused pauses the name alone, for every instance, until the issuer says
// (a CA that refused to see its certificate replaced again), and hands the claim back
// uncharged: nothing was ordered.
func (w *Worker) replacesRefused(o *order, log *zap.Logger, name string, e *issuing.ReplacesRefusedError) (string, time.Duration) {
	at := w.caOf(o.claim.Directory)
	wait := e.RetryAfter
	if wait <= 0 {
		wait = w.cfg.Queue.RetryBase
	}
	var until time.Duration
	err := w.record(o, log, "pause", func(ctx context.Context) (err error) {
		until, err = w.q.PauseAt(ctx, at.directory, issuing.ScopeDomain, name, issuing.PauseRateLimit, wait, e.Error())
		return err
	})
	if err != nil {
		log.Error("could not record the CA's refusal of the replacement", zap.Error(err))
	}
	log.Warn("the CA refused the renewal naming the certificate it replaces; the name waits, not charged",
		zap.String("error", e.Error()), zap.Duration("paused_for", until), zap.String("ca", at.label))
	return w.handBack(o, log, false, "already_replaced"), until
}

// caUnreachable pauses the claim's CA for every instance, on its own backoff, and
// hands the claim back uncharged.
func (w *Worker) caUnreachable(o *order, log *zap.Logger, cause error) (string, time.Duration) {
	at := w.caOf(o.claim.Directory)
	var u issuing.Unreachable
	err := w.record(o, log, "pause unreachable CA", func(ctx context.Context) (err error) {
		u, err = w.q.PauseUnreachable(ctx, at.directory, cause.Error(), unreachableBase, unreachableMax)
		return err
	})
	if err != nil {
		log.Error("could not record that the CA is unreachable", zap.Error(err))
	}
	if at.down.CompareAndSwap(false, true) {
		w.m.setCAUnreachable(at.label, true)
		w.log.Warn("CA unreachable; ordering paused for every instance, nothing charged",
			zap.String("directory", at.directory), zap.String("ca", at.label), zap.String("error", cause.Error()),
			zap.Int("failures", u.Failures), zap.Duration("paused_for", u.For))
	} else {
		log.Debug("CA still unreachable", zap.String("ca", at.label), zap.Int("failures", u.Failures), zap.Duration("paused_for", u.For))
	}
	return w.handBack(o, log, false, "ca_unavailable"), u.For
}

// keyMissing hands the claim back and stops this instance claiming (issuing.KeyError).
// The first such error is logged with the key id.
func (w *Worker) keyMissing(o *order, log *zap.Logger, ke *issuing.KeyError) string {
	if w.keyErr.CompareAndSwap(nil, ke) {
		w.log.Error("a stored key does not open with this instance's --key-encryption-key: it claims nothing more and reports not ready until restarted with the key; nothing is charged",
			zap.String("error", ke.Error()), zap.String("key_id", ke.KeyID))
	}
	outcome := w.handBack(o, log, false, "key_error")
	if outcome == "key_error" {
		log.Warn("order handed back: a stored key does not open; not charged", zap.String("key_id", ke.KeyID))
	}
	return outcome
}

// caAnswered ends the CA's unreachable state if this instance saw it; with a second
// CA, any answer of the first ends it, since whoever saw it down may have restarted.
// Only the caller whose delete ended it logs it.
func (w *Worker) caAnswered(at *ca) {
	if !at.down.Load() && (w.second == nil || at != w.first) {
		return
	}
	ctx, cancel := w.step(context.Background(), true)
	defer cancel()
	ended, err := w.q.ClearUnreachable(ctx, at.directory)
	if err != nil {
		w.logDBError("clear the CA's unreachable state", err)
		return
	}
	if at.down.Swap(false) || ended {
		w.m.setCAUnreachable(at.label, false)
	}
	if ended {
		w.log.Info("CA reachable again; ordering resumes", zap.String("directory", at.directory), zap.String("ca", at.label))
	}
}
