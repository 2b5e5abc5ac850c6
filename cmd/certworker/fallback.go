package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/certstore/seal"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// fallbackFlags name a second ACME CA (docs/cas.md, "A second CA"): its
// own account, profile and ledger limits. Empty --acme-fallback-directory: none.
type fallbackFlags struct {
	FallbackDirectory        string        `name:"acme-fallback-directory" env:"CERTWORKER_ACME_FALLBACK_DIRECTORY" placeholder:"URL" group:"fallback" help:"ACME directory URL of a second CA, asked for a domain when the first cannot issue it: the first has been unreachable or answering 5xx, or its rate limits or the ledger have held the domain back, for longer than --acme-fallback-after; or the first refused the name (caa, rejectedIdentifier, unsupportedIdentifier), then at once. Never after a failed validation. Empty: no second CA."`
	FallbackCABundle         string        `name:"acme-fallback-ca-bundle" env:"CERTWORKER_ACME_FALLBACK_CA_BUNDLE" placeholder:"FILE" group:"fallback" help:"PEM file of roots trusted for the second CA's ACME server, beside the system's."`
	FallbackEABKid           string        `name:"acme-fallback-eab-kid" env:"CERTWORKER_ACME_FALLBACK_EAB_KID" placeholder:"KID" group:"fallback" help:"External account binding key id at the second CA (Google Trust Services and ZeroSSL require one)."`
	FallbackEABHMAC          string        `name:"acme-fallback-eab-hmac" env:"CERTWORKER_ACME_FALLBACK_EAB_HMAC" placeholder:"KEY" group:"fallback" help:"External account binding HMAC key (base64url) at the second CA."`
	FallbackProfile          string        `name:"acme-fallback-profile" env:"CERTWORKER_ACME_FALLBACK_PROFILE" placeholder:"NAME" group:"fallback" help:"ACME profile of every order at the second CA (a domain's ssl_profile is the first CA's); run exits 2 when its directory does not offer it. Empty: the CA's default."`
	FallbackAfter            time.Duration `name:"acme-fallback-after" env:"CERTWORKER_ACME_FALLBACK_AFTER" default:"10m" placeholder:"DURATION" group:"fallback" help:"How long the first CA may hold a domain back before the second is asked, from the later of when the domain fell due and when the hold began."`
	FallbackLimitOrders      string        `name:"acme-fallback-limit-orders-per-account" env:"CERTWORKER_ACME_FALLBACK_LIMIT_ORDERS_PER_ACCOUNT" placeholder:"COUNT/DURATION" group:"fallback" help:"The second CA's --limit-orders-per-account (default: the first's)."`
	FallbackLimitRegistered  string        `name:"acme-fallback-limit-certs-per-registered-domain" env:"CERTWORKER_ACME_FALLBACK_LIMIT_CERTS_PER_REGISTERED_DOMAIN" placeholder:"COUNT/DURATION" group:"fallback" help:"The second CA's --limit-certs-per-registered-domain (default: the first's)."`
	FallbackLimitExactSet    string        `name:"acme-fallback-limit-certs-per-exact-set" env:"CERTWORKER_ACME_FALLBACK_LIMIT_CERTS_PER_EXACT_SET" placeholder:"COUNT/DURATION" group:"fallback" help:"The second CA's --limit-certs-per-exact-set (default: the first's)."`
	FallbackLimitFailedAuthz string        `name:"acme-fallback-limit-failed-authz-per-name" env:"CERTWORKER_ACME_FALLBACK_LIMIT_FAILED_AUTHZ_PER_NAME" placeholder:"COUNT/DURATION" group:"fallback" help:"The second CA's --limit-failed-authz-per-name (default: the first's)."`
	FallbackLimitConsecutive string        `name:"acme-fallback-limit-consecutive-failures" env:"CERTWORKER_ACME_FALLBACK_LIMIT_CONSECUTIVE_FAILURES" placeholder:"COUNT" group:"fallback" help:"The second CA's --limit-consecutive-failures (default: the first's)."`
}

// validateFallback checks the second CA's flags against each other and the first's.
func (c *runCmd) validateFallback() error {
	if c.FallbackDirectory == "" {
		for flag, v := range map[string]string{
			"--acme-fallback-ca-bundle": c.FallbackCABundle, "--acme-fallback-eab-kid": c.FallbackEABKid,
			"--acme-fallback-eab-hmac": c.FallbackEABHMAC, "--acme-fallback-profile": c.FallbackProfile,
			"--acme-fallback-limit-orders-per-account":          c.FallbackLimitOrders,
			"--acme-fallback-limit-certs-per-registered-domain": c.FallbackLimitRegistered,
			"--acme-fallback-limit-certs-per-exact-set":         c.FallbackLimitExactSet,
			"--acme-fallback-limit-failed-authz-per-name":       c.FallbackLimitFailedAuthz,
			"--acme-fallback-limit-consecutive-failures":        c.FallbackLimitConsecutive,
		} {
			if v != "" {
				return usagef("%s: names something of a second CA, and --acme-fallback-directory names none", flag)
			}
		}
		return nil
	}
	switch {
	case c.FallbackDirectory == c.ACMEDirectory:
		return usagef("--acme-fallback-directory: is --acme-directory; a second CA must be another")
	case c.FallbackAfter <= 0:
		return usagef("--acme-fallback-after: must be positive, got %s", c.FallbackAfter)
	case (c.FallbackEABKid == "") != (c.FallbackEABHMAC == ""):
		return usagef("--acme-fallback-eab-kid and --acme-fallback-eab-hmac: an external account binding needs both")
	}
	_, err := c.fallbackLimits(issuing.Limits{})
	return err
}

// fallbackLimits are the second CA's ledger limits: first's, but where an
// --acme-fallback-limit-* flag sets its own.
func (c *runCmd) fallbackLimits(first issuing.Limits) (issuing.Limits, error) {
	l := first
	for _, f := range []struct {
		flag, value string
		into        *issuing.Limit
	}{
		{"--acme-fallback-limit-orders-per-account", c.FallbackLimitOrders, &l.OrdersPerAccount},
		{"--acme-fallback-limit-certs-per-registered-domain", c.FallbackLimitRegistered, &l.CertsPerRegisteredDomain},
		{"--acme-fallback-limit-certs-per-exact-set", c.FallbackLimitExactSet, &l.CertsPerExactSet},
		{"--acme-fallback-limit-failed-authz-per-name", c.FallbackLimitFailedAuthz, &l.FailedAuthzPerName},
	} {
		if f.value == "" {
			continue
		}
		v, err := issuing.ParseLimit(f.value)
		if err != nil {
			return l, usagef("%s: %v", f.flag, err)
		}
		*f.into = v
	}
	if c.FallbackLimitConsecutive != "" {
		v, err := issuing.ParseConsecutiveFailures(c.FallbackLimitConsecutive)
		if err != nil {
			return l, usagef("--acme-fallback-limit-consecutive-failures: %v", err)
		}
		l.ConsecutiveFailures = v
	}
	return l, nil
}

// fallback opens the second CA's account (registering it when new), checks that its
// stored key opens and that it offers --acme-fallback-profile, and returns it for the
// worker; nil without --acme-fallback-directory.
func (c *runCmd) fallback(ctx context.Context, pool *pgxpool.Pool, log *zap.Logger, keks seal.Keyring, first issuing.Limits) (*worker.FallbackCA, *acme.Issuer, error) {
	if c.FallbackDirectory == "" {
		return nil, nil, nil
	}
	limits, err := c.fallbackLimits(first)
	if err != nil {
		return nil, nil, err
	}
	issuer, err := acme.New(ctx, pool, log, acme.Config{Recorder: queue.New(pool, issuing.DefaultConfig()),
		DirectoryURL:         c.FallbackDirectory,
		Email:                c.ACMEEmail,
		CABundle:             c.FallbackCABundle,
		Profile:              c.FallbackProfile,
		EABKeyID:             c.FallbackEABKid,
		EABHMAC:              c.FallbackEABHMAC,
		KeyType:              c.KeyType,
		KeyEncryptionKeys:    keks,
		Preflight:            c.Preflight,
		PreflightResolver:    c.PreflightResolver,
		PreflightPort:        c.PreflightPort,
		PreflightAllowCIDR:   c.PreflightAllow,
		RenewalInfoPerSecond: c.ARIPerSecond,
	})
	if err != nil {
		return nil, nil, usagef("--acme-fallback-directory: %v", err)
	}
	if err := checkAccountKey(ctx, issuer, c.DatabaseURL); err != nil {
		return nil, nil, err
	}
	if err := checkProfileFlag(ctx, issuer, log, "--acme-fallback-profile"); err != nil {
		return nil, nil, err
	}
	log.Info("second CA configured", zap.String("directory", issuer.DirectoryURL()),
		zap.Duration("after", c.FallbackAfter), zap.String("profile", c.FallbackProfile))
	return &worker.FallbackCA{Issuer: issuer, Directory: issuer.DirectoryURL(), After: c.FallbackAfter, Limits: limits}, issuer, nil
}

// secondKeyReady is the part of /readyz about the second CA's stored account key, as
// keysReady's for the first: nil without a second CA.
func secondKeyReady(ctx context.Context, second *acme.Issuer, conn acme.Queryer) error {
	if second == nil {
		return nil
	}
	err := second.CheckAccountKeyOn(ctx, conn)
	var ke *issuing.KeyError
	switch {
	case errors.As(err, &ke):
		return fmt.Errorf("the second CA's account: %w", ke)
	case err != nil:
		return errors.New("cannot read the second CA's stored ACME account")
	}
	return nil
}

// pauseCA is the CA a pause belongs to, for `status`: each CA has its own pauses.
func pauseCA(p issuing.PauseState) string {
	if p.Directory == "" {
		return "(first)"
	}
	return p.Directory
}
