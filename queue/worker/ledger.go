package worker

import (
	"context"
	"errors"

	"go.uber.org/zap"

	"github.com/certworker/certworker/queue"
)

// admit asks the ledger about claims before their orders (when a limit is on) and
// returns the ones that may go. A claim whose name no CA can issue for goes on without
// the ledger: it is failed without an order. Refused claims are handed back and what
// they hit is paused (queue.Admit).
//
// When the ledger cannot be asked, no claim goes, and ok is false: the fill stops
// there rather than claim again into a ledger that does not answer (its lock held by
// an instance cut off mid-transaction: every claim would be taken and handed back for
// nothing). The claims are handed back by the next pass, as claims whose answer was
// lost; and when the ledger's COMMIT may have gone through, their rows are settled as
// not sent after that (settleNotSent), so that they do not count as orders in flight.
func (w *Worker) admit(ctx context.Context, claims []queue.Claim) (admitted []queue.Claim, ok bool) {
	if !w.cfg.Limits.Any() || len(claims) == 0 {
		return claims, true
	}
	var asks []queue.Admission
	var invalid []queue.Claim
	for _, c := range claims {
		name, err := queue.CheckName(c.Domain)
		if err != nil {
			invalid = append(invalid, c)
			continue
		}
		asks = append(asks, queue.Admission{Claim: c, Name: name,
			RegisteredDomain: queue.RegisteredDomain(name), Renewal: c.CurrentPEM != ""})
	}
	if len(asks) == 0 {
		return claims, true
	}
	actx, cancel := w.step(ctx, true)
	defer cancel()
	admitted, refused, err := w.q.Admit(actx, w.cfg.Directory, w.cfg.Limits, asks)
	if err != nil {
		if !errors.Is(err, queue.ErrLedgerBusy) {
			w.health.failed()
		}
		if errors.Is(err, queue.ErrCommitUnknown) {
			for _, a := range asks {
				w.notSent = append(w.notSent, a.Claim.Token)
			}
		}
		w.untracked = true
		w.logDBError("ask the ledger", err)
		return invalid, false
	}
	for _, r := range refused {
		w.m.outcome("ledger_held", 0)
		w.log.Info("order held back by the ledger: the CA would refuse it; the domain waits, not charged",
			zap.String("domain", r.Claim.Domain), zap.String("domain_id", r.Claim.ID), zap.String("reason", r.Reason))
	}
	return append(invalid, admitted...), true
}

// settleNotSent records as not sent the ledger rows of claims whose Admit may have
// committed without its answer arriving (admit), once the pass has handed those
// claims back: none of their orders was placed. What it cannot settle now it tries
// at the next pass; SettleStaleLedger catches what an instance that stops leaves.
func (w *Worker) settleNotSent() {
	for len(w.notSent) > 0 {
		ctx, cancel := w.step(context.Background(), true)
		err := w.q.SettleLedger(ctx, w.cfg.Directory, w.notSent[0], queue.LedgerNotSent, w.cfg.Limits)
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
	if !w.cfg.Limits.Any() {
		return
	}
	var outcome string
	switch {
	case r.issued:
		// The CA issued, whatever became of the claim (lost, no longer acme, the
		// write that stores it given up): the CA counts the certificate.
		outcome = queue.LedgerIssued
	case r.outcome == "invalid", r.outcome == "unrecorded":
		return // no ledger row, or nothing known
	case r.outcome == "preflight_failed", r.outcome == "rate_limited", r.outcome == "key_error",
		r.outcome == "profile_refused", r.outcome == "profile_halted":
		// Nothing the CA counts: the preflight sent nothing, nor did an order
		// without its account key or under a profile the directory does not list,
		// and Let's Encrypt refunds a new order it refused.
		outcome = queue.LedgerNotSent
	default:
		outcome = queue.LedgerFailed
		if r.authzFailed {
			outcome = queue.LedgerFailedAuthz
		}
	}
	ctx, cancel := w.step(context.Background(), true)
	defer cancel()
	if err := w.q.SettleLedger(ctx, w.cfg.Directory, o.claim.Token, outcome, w.cfg.Limits); err != nil {
		w.logDBError("record the order's end in the ledger", err)
	}
}
