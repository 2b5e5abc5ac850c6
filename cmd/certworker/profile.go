package main

import (
	"context"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/queue/issuing"
)

// profileCheckTimeout bounds run's question to the CA, at start, about the profiles it
// offers: one GET of its directory, which a CA answers in well under a second. A CA
// that says nothing for that long is not waited for (see checkProfile).
const profileCheckTimeout = 10 * time.Second

// checkProfile refuses to start (exit 2) when the CA's directory does not list
// --acme-profile in meta.profiles: every domain without a profile of
// its own would be refused, which is the operator's configuration, not the domains'.
//
// A CA that cannot be asked (down, 5xx, no answer within profileCheckTimeout) does
// not stop the start: a worker that will not start while its CA is briefly down would
// turn a CA's blip into an outage of the fleet. It starts with a warning, and the
// first order reads the directory: if the CA does not offer the profile then, this
// instance hands the order back uncharged and stops claiming, with /readyz 503 naming
// the flag, until it is restarted with a profile the CA offers.
func checkProfile(ctx context.Context, issuer *acme.Issuer, log *zap.Logger) error {
	return checkProfileFlag(ctx, issuer, log, "--acme-profile")
}

// checkProfileFlag is checkProfile for the issuer whose profile flag is flag (the
// second CA's is --acme-fallback-profile).
func checkProfileFlag(ctx context.Context, issuer *acme.Issuer, log *zap.Logger, flag string) error {
	profile := issuer.DefaultProfile()
	if profile == "" {
		return nil // the CA's default: the orders name none
	}
	pctx, cancel := context.WithTimeout(ctx, profileCheckTimeout)
	defer cancel()
	offered, err := issuer.Profiles(pctx)
	if err != nil {
		log.Warn("could not ask the CA which profiles it offers; starting anyway, and the first order checks "+flag,
			zap.String("profile", profile), zap.String("directory", issuer.DirectoryURL()), zap.String("error", err.Error()))
		return nil
	}
	if !slices.Contains(offered, profile) {
		return usagef("%s: %s (directory %s)", flag,
			(&issuing.ProfileError{Profile: profile, Offered: offered}).Error(), issuer.DirectoryURL())
	}
	return nil
}
