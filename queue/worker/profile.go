package worker

import (
	"context"
	"errors"
	"fmt"

	"github.com/certworker/certworker/queue/issuing"
	"go.uber.org/zap"
)

// A domain's ACME profile: its ssl_profile, or --acme-profile when NULL. A CA that
// does not offer the domain's own is the tenant's to fix (queue.RefuseProfile); one
// that does not offer --acme-profile is the operator's (profileHalt).

// profileLister is implemented by an issuer that can list its CA's profiles.
type profileLister interface {
	Profiles(ctx context.Context) ([]string, error)
}

// errProfileSettled: the order ended over a profile, and its outcome is recorded.
type errProfileSettled struct{ outcome string }

func (e *errProfileSettled) Error() string { return "order settled over its profile: " + e.outcome }

// issueUnderProfile places the claim's order under the profile the domain should
// have, handling a CA that does not offer it: the certificate, the issuer's error, or
// an *errProfileSettled. At most three orders: own profile, certificate's, default.
func (w *Worker) issueUnderProfile(ctx context.Context, o *order, log *zap.Logger, name string) (*issuing.Certificate, error) {
	c := &o.claim
	profile, own := "", false
	switch {
	case c.Profile == nil:
	case c.CurrentPEM != "" && *c.Profile == c.ProfileRefused:
		// Refused before: renew under the certificate's profile, and keep telling.
		profile = c.CertProfile
		c.Notice = w.keptNotice(ctx, c, &issuing.ProfileError{Profile: *c.Profile})
	default:
		if err := issuing.CheckProfileName(*c.Profile); err != nil {
			renew, outcome := w.refuseProfile(ctx, o, log, err)
			if !renew {
				return nil, &errProfileSettled{outcome}
			}
			profile = c.CertProfile
		} else {
			profile, own = *c.Profile, true
		}
	}
	for {
		cert, err := w.issue(ctx, o, name, profile)
		var pe *issuing.ProfileError
		if err == nil || ctx.Err() != nil || !errors.As(err, &pe) {
			if err == nil && own {
				c.ProfileRefused, c.Notice = "", ""
			}
			return cert, err
		}
		switch {
		case own:
			renew, outcome := w.refuseProfile(ctx, o, log, pe)
			if !renew {
				return nil, &errProfileSettled{outcome}
			}
			profile, own = c.CertProfile, false
		case profile != "":
			// The certificate's profile is gone from the CA: renew under --acme-profile.
			log.Info("the CA no longer offers the certificate's profile; renewing under --acme-profile",
				zap.String("profile", profile), zap.String("error", pe.Error()))
			profile = ""
		default:
			return nil, &errProfileSettled{w.profileHalt(o, log, pe)}
		}
	}
}

// refuseProfile records the refusal of the domain's own profile and reports whether
// the order goes on under the certificate's; otherwise outcome is the order's.
func (w *Worker) refuseProfile(ctx context.Context, o *order, log *zap.Logger, cause error) (renew bool, outcome string) {
	c := &o.claim
	base := issuing.ProfilePrefix + cause.Error()
	none := base + "; no certificate is ordered until the domain's ssl_profile names a profile the CA offers"
	kept := w.keptNotice(ctx, c, cause)
	// The write ends the claim unless it answers renew.
	o.finishing.Store(true)
	err := w.record(o, log, "record a refused profile", func(ctx context.Context) (err error) {
		renew, err = w.q.RefuseProfile(ctx, *c, *c.Profile, none, kept)
		return err
	})
	o.finishing.Store(err != nil || !renew) // renewing, the order goes on under its claim
	if outcome, done := w.notRecorded(o, log, err); done {
		return false, outcome
	}
	switch {
	case renew:
		c.ProfileRefused, c.Notice = *c.Profile, kept
		log.Warn("the CA does not offer the domain's profile; renewing under its certificate's",
			zap.String("error", kept), zap.Int("attempt", max(c.Attempts, 0)+1))
		return true, ""
	case c.CurrentPEM == "":
		log.Error("the CA does not offer the domain's profile; marked failed until the tenant sets another",
			zap.String("error", none), zap.Int("attempt", max(c.Attempts, 0)+1))
	default:
		log.Warn("the CA does not offer the domain's profile; it keeps its certificate",
			zap.String("error", kept), zap.Int("attempt", max(c.Attempts, 0)+1))
	}
	return false, "profile_refused"
}

// keptNotice is ssl_error's note for a domain renewed under its certificate's
// profile, naming what the CA offers when known.
func (w *Worker) keptNotice(ctx context.Context, c *issuing.Claim, cause error) string {
	var pe *issuing.ProfileError
	if errors.As(cause, &pe) && pe.Offered == nil {
		if l, ok := w.cfg.Issuer.(profileLister); ok {
			if offered, err := l.Profiles(ctx); err == nil {
				withList := *pe
				withList.Offered = offered
				cause = &withList
			}
		}
	}
	under := "--acme-profile"
	if c.CertProfile != "" {
		under = fmt.Sprintf("profile %q", c.CertProfile)
	}
	return fmt.Sprintf("%s%s; the domain keeps its certificate, renewed under %s, until its ssl_profile names a profile the CA offers",
		issuing.ProfilePrefix, cause, under)
}

// profileHalt hands the claim back uncharged and stops this instance claiming until
// a restart (Halted): --acme-profile is not offered, the operator's to fix.
func (w *Worker) profileHalt(o *order, log *zap.Logger, pe *issuing.ProfileError) string {
	if w.profileErr.CompareAndSwap(nil, pe) {
		w.log.Error("the CA does not offer --acme-profile: this instance claims nothing more and reports not ready until restarted with a profile the CA offers; nothing is charged",
			zap.String("error", pe.Error()))
	}
	outcome := w.handBack(o, log, false, "profile_halted")
	if outcome == "profile_halted" {
		log.Warn("order handed back: the CA does not offer --acme-profile; not charged")
	}
	return outcome
}
