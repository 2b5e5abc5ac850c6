package worker

import (
	"context"

	"go.uber.org/zap"

	"github.com/certworker/certworker/queue"
)

// admit asks the ledger about claims before their orders (when a limit is on) and
// returns the ones that may go. A claim whose name no CA can issue for goes on without
// the ledger: it is failed without an order. Refused claims are handed back and what
// they hit is paused (queue.Admit). When the ledger cannot be asked, no claim goes:
// they are handed back by the next pass, as claims whose answer was lost.
func (w *Worker) admit(ctx context.Context, claims []queue.Claim) []queue.Claim {
	if !w.cfg.Limits.Any() || len(claims) == 0 {
		return claims
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
		return claims
	}
	actx, cancel := w.step(ctx, true)
	defer cancel()
	admitted, refused, err := w.q.Admit(actx, w.cfg.Directory, w.cfg.Limits, asks)
	if err != nil {
		w.health.failed()
		w.untracked = true
		w.logDBError("ask the ledger", err)
		return invalid
	}
	for _, r := range refused {
		w.m.outcome("ledger_held", 0)
		w.log.Info("order held back by the ledger: the CA would refuse it; the domain waits, not charged",
			zap.String("domain", r.Claim.Domain), zap.String("domain_id", r.Claim.ID), zap.String("reason", r.Reason))
	}
	return append(invalid, admitted...)
}

// settleLedger records in the ledger how an order ended (when a limit is on).
func (w *Worker) settleLedger(o *order, r result) {
	if !w.cfg.Limits.Any() {
		return
	}
	var outcome string
	switch r.outcome {
	case "invalid", "unrecorded":
		return // no ledger row, or nothing known
	case "issued":
		outcome = queue.LedgerIssued
	case "preflight_failed", "rate_limited", "key_error", "profile_refused", "profile_halted":
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
