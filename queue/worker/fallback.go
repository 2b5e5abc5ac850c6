package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"go.uber.org/zap"
)

// A second CA (queue/fallback.go). The worker keeps what is per CA apart, and
// overrides the claim's decision only when the first CA refuses the name for good.

// FallbackCA is the second CA.
type FallbackCA struct {
	// Issuer places its orders, under its own account.
	Issuer issuing.Issuer
	// Directory is its ACME directory URL: the key of its pauses and its ledger.
	Directory string
	// After is how long the first CA may hold a domain back before this one is asked.
	After time.Duration
	// Limits are the ledger's limits for this CA (--acme-fallback-limit-*).
	Limits issuing.Limits
}

type ca struct {
	// label is "primary" or "fallback", for logs and metrics.
	label     string
	directory string
	issuer    issuing.Issuer
	limits    issuing.Limits
	// down: this instance found the CA unreachable and has not seen it answer since.
	down atomic.Bool
}

// caOf is the CA at directory: the second when it is its directory, else the first.
func (w *Worker) caOf(directory string) *ca {
	if w.second != nil && directory == w.second.directory {
		return w.second
	}
	return w.first
}

func (w *Worker) cas() []*ca {
	if w.second == nil {
		return []*ca{w.first}
	}
	return []*ca{w.first, w.second}
}

// replacesPEM is the certificate an order names in "replaces" (RFC 9773): the stored
// one when the order's CA issued it (certOfSQL's rule), else none.
func (w *Worker) replacesPEM(c issuing.Claim) string {
	issuedBy := c.CertDirectory
	if issuedBy == "" {
		issuedBy = w.first.directory
	}
	if w.caOf(issuedBy) != w.caOf(c.Directory) {
		return ""
	}
	return c.CurrentPEM
}

// logFallback says why the second CA was asked, at the start of its order.
func (w *Worker) logFallback(c issuing.Claim, log *zap.Logger) {
	if w.second == nil || c.Directory != w.second.directory {
		return
	}
	w.m.fallback(c.FallbackCause)
	why := map[string]string{
		issuing.FallbackOutage:    "the first CA has been unreachable or answering 5xx for longer than --acme-fallback-after",
		issuing.FallbackRateLimit: "a rate limit of the first CA has held the domain back for longer than --acme-fallback-after",
		issuing.FallbackLedger:    "the ledger's limits for the first CA have held the domain back for longer than --acme-fallback-after",
		issuing.FallbackRefused:   "the first CA refused the name (caa, rejectedIdentifier or unsupportedIdentifier)",
		issuing.FallbackRenewal:   "the certificate is the second CA's, and the first CA is held back",
	}[c.FallbackCause]
	log.Info("asking the second CA", zap.String("cause", c.FallbackCause), zap.String("why", why),
		zap.String("directory", c.Directory))
}

// refusedByFirst handles the first CA's refusal for good, with a second CA: recorded,
// and the claim handed back for the second; when the second refused too, the domain
// fails. handled is false for other refusals.
func (w *Worker) refusedByFirst(o *order, log *zap.Logger, perm *issuing.PermanentError) (outcome string, handled bool) {
	c := o.claim
	if w.second == nil || !perm.Refused || w.caOf(c.Directory) != w.first {
		return "", false
	}
	if c.RefusedBy == w.second.directory {
		reason := fmt.Sprintf("%s; the second CA (%s) refused the name before: no CA will issue for it", perm.Error(), w.second.directory)
		return w.failForGood(o, log, reason, "permanent"), true
	}
	err := w.record(o, log, "record the first CA's refusal", func(ctx context.Context) error {
		return w.q.RecordRefused(ctx, c, w.first.directory, refusalCause(perm))
	})
	if outcome, done := w.notRecorded(o, log, err); done {
		return outcome, true
	}
	log.Warn("the first CA refused the name; the second CA is asked at once, not charged",
		zap.String("error", perm.Error()), zap.String("directory", w.second.directory))
	return w.handBack(o, log, false, "refused_first"), true
}

// refusedBySecond fails the domain when the first refused it too; else it waits for
// the first, uncharged.
func (w *Worker) refusedBySecond(o *order, log *zap.Logger, perm *issuing.PermanentError) (outcome string, handled bool) {
	c := o.claim
	if w.second == nil || !perm.Refused || w.caOf(c.Directory) != w.second {
		return "", false
	}
	if c.RefusedBy == w.first.directory {
		reason := fmt.Sprintf("%s; the first CA (%s) refused the name before: no CA will issue for it", perm.Error(), w.first.directory)
		return w.failForGood(o, log, reason, "permanent"), true
	}
	err := w.record(o, log, "record the second CA's refusal", func(ctx context.Context) error {
		return w.q.RecordRefused(ctx, c, w.second.directory, refusalCause(perm))
	})
	if outcome, done := w.notRecorded(o, log, err); done {
		return outcome, true
	}
	log.Warn("the second CA refused the name; the domain waits for the first, not charged",
		zap.String("error", perm.Error()), zap.String("directory", w.second.directory))
	return w.handBack(o, log, true, "refused_second"), true
}

// refusalCause is what ssl_ca_refused_cause records of perm.
func refusalCause(perm *issuing.PermanentError) string {
	if perm.CAA {
		return issuing.RefusedByCAA
	}
	return issuing.RefusedByCA
}

// fallbackProfileError is the second CA's refusal of --acme-fallback-profile,
// charged, naming the flag.
func fallbackProfileError(pe *issuing.ProfileError) error {
	return errors.New("the second CA does not offer --acme-fallback-profile: " + pe.Error())
}

// CAAFunc reads a name's CAA records: the CAs they allow by directory (nil: all) and
// in words. An error (the tenant's DNS failing, "caa: ...") is charged and becomes
// ssl_error. It MUST be safe for concurrent use.
type CAAFunc func(ctx context.Context, name string) (allowed issuing.Verdict, allows string, err error)

// checkCAA applies the name's CAA records before the order (issuing.Decide), and
// records a forbidden CA in ssl_ca_refused. done reports the claim settled here.
func (w *Worker) checkCAA(ctx context.Context, o *order, log *zap.Logger, name string) (outcome string, retryIn time.Duration, done bool) {
	if w.cfg.CAA == nil {
		return "", 0, false
	}
	allowed, allows, err := w.cfg.CAA(ctx, name)
	if err != nil && ctx.Err() != nil {
		// Cut short by this instance: nothing was learnt, nothing is charged.
		log.Info("CAA look-up cut short; the claim is handed back uncharged", zap.Error(context.Cause(ctx)))
		return w.handBack(o, log, false, "released"), 0, true
	}
	if err != nil {
		outcome, retryIn = w.fail(o, log, err.Error(), "caa_failed")
		return outcome, retryIn, true
	}
	c := o.claim
	if c.RefusedBy != "" && c.RefusedCause == issuing.RefusedByCAA && allowed.Allows(c.RefusedBy) {
		// CAA caused the refusal and now allows the CA: forget it and route afresh.
		err := w.record(o, log, "forget a refusal CAA no longer makes", func(ctx context.Context) error {
			return w.q.ForgetRefused(ctx, c)
		})
		if outcome, done := w.notRecorded(o, log, err); done {
			return outcome, 0, true
		}
		log.Info("the name's CAA records now allow a CA they forbade; its refusal is forgotten, nothing charged",
			zap.String("allowed", c.RefusedBy), zap.String("allows", allows))
		return w.handBack(o, log, false, "caa_allows_again"), 0, true
	}
	var fb *issuing.Fallback
	if w.second != nil {
		fb = &issuing.Fallback{Directory: w.second.directory}
	}
	d := issuing.Decide(c, w.first.directory, fb, false, allowed)
	var forbidden string
	switch {
	case d.Directory == c.Directory:
		return "", 0, false
	case d.Directory != "":
		forbidden, outcome = c.Directory, "caa_other_ca"
	case d.Wait:
		forbidden, outcome = w.second.directory, "caa_waits"
	default:
		var cas []string
		for _, at := range w.cas() {
			cas = append(cas, at.directory)
		}
		reason := fmt.Sprintf("caa: the name's CAA records allow %s, and no CA certworker orders from (%s)",
			allowsOrNone(allows), strings.Join(cas, ", "))
		return w.failForGood(o, log, reason, "caa_refused"), 0, true
	}
	err = w.record(o, log, "record a CA that CAA forbids", func(ctx context.Context) error {
		return w.q.RecordRefused(ctx, c, forbidden, issuing.RefusedByCAA)
	})
	if outcome, done := w.notRecorded(o, log, err); done {
		return outcome, 0, true
	}
	log.Info("the name's CAA records forbid a CA; it is not asked, nothing charged",
		zap.String("forbidden", forbidden), zap.String("allows", allows), zap.String("then", outcome))
	return w.handBack(o, log, outcome == "caa_waits", outcome), 0, true
}

func allowsOrNone(allows string) string {
	if allows == "" {
		return "no CA"
	}
	return allows
}
