package acme

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/certworker/certworker/certstore/seal"
	"github.com/certworker/certworker/queue/issuing"
)

// An order's error becomes the domain's ssl_error, which the proxy shows its tenant
// (issuing.Issuer: any error but a rate limit or an unreachable CA is recorded as it
// reads). Three kinds of text in it are the operator's, not the tenant's:
//
//   - the database's errors: pgx's connection errors name the database's user,
//     host and port ("failed to connect to `user=certworker database=proxy`:
//     10.0.3.7:5432 ..."), its I/O errors the server's address;
//   - key errors: a sealed key names the id of the key encryption key it needs (a
//     *issuing.KeyError is left as it is: the worker never records it as ssl_error);
//   - Let's Encrypt's unpause link, which acts for the whole account.
//
// forTenant logs each, in full, with the domain, and returns an error that says
// what failed in words the tenant may read. The returned error wraps err, so the
// worker still classifies it by type.
func (i *Issuer) forTenant(err error, req issuing.Request) error {
	if err == nil {
		return nil
	}
	log := i.log.With(issuing.LogDomain(req.Domain, req.DomainID, req.TenantID))
	var paused *pausedError
	if errors.As(err, &paused) {
		log.Error("the CA has paused issuance for this name on the account; a person must open the unpause link, then run `certworker retry`",
			zap.String("unpause_url", paused.link))
	}
	if db := databaseError(err); db != nil {
		log.Warn("order failed on a database error", zap.Error(err))
		return &redacted{msg: prefixOf(err, db) + "a database error (the details are in certworker's log)", err: err}
	}
	var ke *issuing.KeyError
	if errors.As(err, &ke) {
		// Never written to ssl_error: the worker hands the claim back uncharged and
		// logs it, key id included, for the operator (issuing.KeyError).
		return err
	}
	if keyError(err) {
		log.Error("order failed: the stored key cannot be opened with the configured --key-encryption-key", zap.Error(err))
		return &redacted{msg: "acme: a stored key cannot be opened with the configured key encryption keys (an operator's matter; the details are in certworker's log)", err: err}
	}
	return err
}

// redacted is an error whose message leaves out what the tenant must not read; it
// wraps the original for errors.Is and errors.As.
type redacted struct {
	msg string
	err error
}

func (e *redacted) Error() string { return e.msg }
func (e *redacted) Unwrap() error { return e.err }

// databaseError is the first error in err's chain that comes from pgx's connection
// layer, or nil: a server's error (PgError), a failed connection (ConnectError), a
// connection string it cannot read, or one of pgconn's own I/O and timeout errors,
// which all tell whether a retry is safe (SafeToRetry).
func databaseError(err error) error {
	switch err.(type) {
	case nil:
		return nil
	case *pgconn.PgError, *pgconn.ConnectError, *pgconn.ParseConfigError, *pgconn.PrepareError:
		return err
	}
	if _, ok := err.(interface{ SafeToRetry() bool }); ok {
		return err
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return databaseError(u.Unwrap())
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if db := databaseError(e); db != nil {
				return db
			}
		}
	}
	return nil
}

// prefixOf is what err's message says before inner's ("acme: preflight: store probe
// token: "), when err wraps inner's text at its end; "acme: " otherwise.
func prefixOf(err, inner error) string {
	if p, ok := strings.CutSuffix(err.Error(), inner.Error()); ok && p != "" {
		return p
	}
	return "acme: "
}

// keyError reports whether err is a stored key that the configured key encryption
// keys cannot open (seal's errors name the key id).
func keyError(err error) bool {
	return errors.Is(err, seal.ErrUnknownKey) || errors.Is(err, seal.ErrUnseal) ||
		errors.Is(err, seal.ErrNoKey) || errors.Is(err, seal.ErrFormat)
}
