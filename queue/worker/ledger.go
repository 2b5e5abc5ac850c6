package worker

import (
	"context"
	"errors"
	"strings"

	"go.uber.org/zap"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// admit asks the ledger about claims before their orders (when a limit is on) and
// returns those that may go; refused ones are handed back (queue.Admit). When the
// ledger cannot be asked, none goes and ok is false, so the fill stops; the next pass
// hands them back and settleNotSent settles what the COMMIT may have written.
func (w *Worker) admit(ctx context.Context, claims []issuing.Claim) (admitted []issuing.Claim, ok bool) {
	if len(claims) == 0 {
		return claims, true
	}
	// Each CA's ledger, with its own limits.
	ok = true
	for _, at := range w.cas() {
		var mine []issuing.Claim
		for _, c := range claims {
			if w.caOf(c.Directory) == at {
				mine = append(mine, c)
			}
		}
		if len(mine) == 0 {
			continue
		}
		got, answered := w.admitAt(ctx, at, mine)
		admitted = append(admitted, got...)
		ok = ok && answered
	}
	return admitted, ok
}

func (w *Worker) admitAt(ctx context.Context, at *ca, claims []issuing.Claim) (admitted []issuing.Claim, ok bool) {
	if !at.limits.Any() {
		return claims, true
	}
	var asks []queue.Admission
	var invalid []issuing.Claim
	for _, c := range claims {
		name, err := issuing.CheckNameFor(c.Domain, w.cfg.Wildcards)
		if err != nil {
			invalid = append(invalid, c)
			continue
		}
		// Another CA's certificate is no renewal to this one (replacesPEM).
		asks = append(asks, queue.Admission{Claim: c, Name: name,
			RegisteredDomain: issuing.RegisteredDomain(name), Renewal: w.replacesPEM(c) != ""})
	}
	if len(asks) == 0 {
		return claims, true
	}
	actx, cancel := w.step(ctx, true)
	defer cancel()
	admitted, refused, err := w.q.Admit(actx, at.directory, at.limits, asks)
	if err != nil {
		if !errors.Is(err, issuing.ErrLedgerBusy) {
			w.health.failed(err)
		}
		if errors.Is(err, issuing.ErrCommitUnknown) {
			for _, a := range asks {
				w.notSent = append(w.notSent, notSent{token: a.Claim.Token, at: at})
			}
		}
		w.untracked = true
		w.logDBError("ask the ledger", err)
		return invalid, false
	}
	for _, r := range refused {
		if r.Stopped {
			w.m.outcome("too_many_failures", 0)
			msg := "domain failed: its name failed validation too often in a row at every CA it may go to; not ordered"
			if r.Rerouted {
				msg = "name not ordered here: it failed validation too often in a row at this CA; it goes to the other CA"
			}
			w.log.Warn(msg, issuing.LogDomain(r.Claim.Domain, r.Claim.ID, r.Claim.TenantID),
				zap.String("reason", r.Reason), zap.String("ca", at.label))
			continue
		}
		w.m.outcome("ledger_held", 0)
		w.log.Info("order held back by the ledger: the CA would refuse it; the domain waits, not charged",
			issuing.LogDomain(r.Claim.Domain, r.Claim.ID, r.Claim.TenantID), zap.String("reason", r.Reason),
			zap.String("ca", at.label))
	}
	return append(invalid, admitted...), true
}

// readmit asks the CA's ledger again about renewal claim c, now to go without
// "replaces": as a new order.
func (w *Worker) readmit(ctx context.Context, at *ca, c issuing.Claim, name string) error {
	rctx, cancel := w.step(ctx, true)
	defer cancel()
	err := w.q.Readmit(rctx, at.directory, at.limits, queue.Admission{Claim: c, Name: name,
		RegisteredDomain: issuing.RegisteredDomain(name)})
	var refused *issuing.LedgerRefusedError
	if err != nil && !errors.As(err, &refused) {
		// The claim goes back uncharged, as for a refusal.
		w.logDBError("ask the ledger again about a renewal sent without replaces", err)
		return &issuing.LedgerRefusedError{Reason: "ledger: could not be asked again about the order without replaces"}
	}
	return err
}

// notSent is a claim whose Admit may have committed unseen.
type notSent struct {
	token string
	at    *ca
}

// settleNotSent records as not sent the ledger rows of handed-back claims whose Admit
// may have committed unseen; SettleStaleLedger catches what it misses.
func (w *Worker) settleNotSent() {
	for len(w.notSent) > 0 {
		ctx, cancel := w.step(context.Background(), true)
		n := w.notSent[0]
		err := w.q.SettleLedger(ctx, n.at.directory, n.token, issuing.LedgerNotSent, n.at.limits)
		cancel()
		if err != nil {
			w.logDBError("record in the ledger that a handed-back claim was never ordered", err)
			return
		}
		w.notSent = w.notSent[1:]
	}
}

// settleLedger records in the ledger how an order ended (when a limit is on).
func (w *Worker) settleLedger(o *order, r result) {
	at := w.caOf(o.claim.Directory)
	if !at.limits.Any() {
		return
	}
	var outcome string
	switch {
	case r.issued:
		// The CA issued, whatever became of the claim: the CA counts it.
		outcome = issuing.LedgerIssued
	case r.outcome == "invalid", r.outcome == "unrecorded":
		return // no ledger row, or nothing known
	case r.outcome == "preflight_failed", r.outcome == "waiting_dns", r.outcome == "rate_limited", r.outcome == "key_error", r.outcome == "ledger_held", r.outcome == "already_replaced",
		r.outcome == "profile_refused", r.outcome == "profile_halted",
		strings.HasPrefix(r.outcome, "caa_"):
		// Nothing the CA counts was sent, or Let's Encrypt refunds a refused new order.
		outcome = issuing.LedgerNotSent
	default:
		outcome = issuing.LedgerFailed
		if r.authzFailed {
			outcome = issuing.LedgerFailedAuthz
		}
	}
	ctx, cancel := w.step(context.Background(), true)
	defer cancel()
	if err := w.q.SettleLedger(ctx, at.directory, o.claim.Token, outcome, at.limits); err != nil {
		w.logDBError("record the order's end in the ledger", err)
	}
}
