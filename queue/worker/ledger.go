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
func (w *Worker) admit(ctx context.Context, claims []issuing.Claim) (admitted []issuing.Claim, ok bool) {
	if len(claims) == 0 {
		return claims, true
	}
	// Each CA's ledger, with its own limits, for the claims the claim sent to it.
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

// admitAt is admit for the claims that go to the CA at.
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
		// A certificate of the other CA's is no renewal to this one (replacesPEM).
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

// readmit asks the CA's ledger again about claim c, admitted as a renewal, whose order
// is about to go without "replaces" (queue.Queue.Readmit): as a new order.
func (w *Worker) readmit(ctx context.Context, at *ca, c issuing.Claim, name string) error {
	rctx, cancel := w.step(ctx, true)
	defer cancel()
	err := w.q.Readmit(rctx, at.directory, at.limits, queue.Admission{Claim: c, Name: name,
		RegisteredDomain: issuing.RegisteredDomain(name)})
	var refused *issuing.LedgerRefusedError
	if err != nil && !errors.As(err, &refused) {
		// A ledger that cannot be asked lets nothing go; the claim is handed back,
		// uncharged, as a refusal is.
		w.logDBError("ask the ledger again about a renewal sent without replaces", err)
		return &issuing.LedgerRefusedError{Reason: "ledger: could not be asked again about the order without replaces"}
	}
	return err
}

// notSent is a claim whose ledger row at a CA an Admit may have committed without its
// answer arriving.
type notSent struct {
	token string
	at    *ca
}

// settleNotSent records as not sent the ledger rows of claims whose Admit may have
// committed without its answer arriving (admit), once the pass has handed those
// claims back: none of their orders was placed. What it cannot settle now it tries
// at the next pass; SettleStaleLedger catches what an instance that stops leaves.
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
		// The CA issued, whatever became of the claim (lost, no longer acme, the
		// write that stores it given up): the CA counts the certificate.
		outcome = issuing.LedgerIssued
	case r.outcome == "invalid", r.outcome == "unrecorded":
		return // no ledger row, or nothing known
	case r.outcome == "preflight_failed", r.outcome == "waiting_dns", r.outcome == "rate_limited", r.outcome == "key_error", r.outcome == "ledger_held",
		r.outcome == "profile_refused", r.outcome == "profile_halted",
		strings.HasPrefix(r.outcome, "caa_"):
		// Nothing the CA counts: the preflight sent nothing (nor did a name that
		// waits for its DNS), nor did an order that
		// the name's CAA records stopped (caa_*), nor one
		// without its account key or under a profile the directory does not list,
		// and Let's Encrypt refunds a new order it refused.
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
