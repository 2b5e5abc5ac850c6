package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// releaseClaimSQL is the part of every finishing write that drops the claim.
const releaseClaimSQL = `ssl_claim_token = NULL, ssl_claimed_by = NULL, ssl_lease_expires_at = NULL`

// MarkActive stores the certificate and turns the domain active in one statement (so
// in one transaction, and one round trip): the proxy never sees one without the
// other. The certificate row is upserted by domain; auto_renew keeps whatever the
// proxy set. Nothing is written when the claim is no longer held.
func (q *Queue) MarkActive(ctx context.Context, c Claim, cert *Certificate) error {
	renewAt := cert.RenewAt
	if renewAt.IsZero() {
		// An issuer that gave no renewal time must not make the certificate due at
		// once (and on every pass after).
		renewAt = RenewAtFromValidity(cert.NotBefore, cert.NotAfter)
	}
	var stored int
	err := q.db.QueryRow(ctx, `
WITH d AS (
    UPDATE proxy_domains SET
        ssl_status = 'active', ssl_expires_at = $3, ssl_error = NULL, ssl_attempts = 0,
        updated_at = now(), `+releaseClaimSQL+`
    WHERE id = $1 AND ssl_claim_token = $2 AND ssl_status = 'provisioning'
    RETURNING domain
)
INSERT INTO proxy_certificates
    (domain, certificate_pem, private_key_pem, expires_at, not_before, issuer, serial, renew_at)
SELECT d.domain, $4, $5, $3, $6, $7, $8, $9 FROM d
ON CONFLICT (domain) DO UPDATE SET
    certificate_pem = EXCLUDED.certificate_pem,
    private_key_pem = EXCLUDED.private_key_pem,
    expires_at = EXCLUDED.expires_at,
    not_before = EXCLUDED.not_before,
    issuer = EXCLUDED.issuer,
    serial = EXCLUDED.serial,
    renew_at = EXCLUDED.renew_at,
    updated_at = now()
RETURNING 1`,
		c.ID, c.Token, cert.NotAfter, cert.ChainPEM, cert.PrivateKey, cert.NotBefore,
		cert.Issuer, cert.Serial, renewAt).Scan(&stored)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrClaimLost
	}
	if err != nil {
		return fmt.Errorf("store certificate: %w", err)
	}
	return nil
}

// Failure is what MarkFailed recorded.
type Failure struct {
	// Attempts is the new count.
	Attempts int
	// GaveUp: the domain reached the limit and is now 'failed'.
	GaveUp bool
	// RetryIn is the backoff before the next attempt (0 when it gave up).
	RetryIn time.Duration
}

// MarkFailed records a failure: ssl_error, one more attempt, and back to 'pending', or
// to 'failed' at the limit, which the worker does not pick up. ssl_error carries the
// reason either way: it is the only way an operator finds out why a domain is stuck.
// A negative count in a hand-edited row counts as 0.
func (q *Queue) MarkFailed(ctx context.Context, c Claim, reason string) (Failure, error) {
	var f Failure
	var status string
	err := q.db.QueryRow(ctx, `
UPDATE proxy_domains SET
    ssl_status = CASE WHEN `+nextAttemptSQL+` >= $4 THEN 'failed' ELSE 'pending' END,
    ssl_error = $3,
    ssl_attempts = `+nextAttemptSQL+`,
    updated_at = now(), `+releaseClaimSQL+`
WHERE id = $1 AND ssl_claim_token = $2 AND ssl_status = 'provisioning'
RETURNING ssl_attempts, ssl_status`, c.ID, c.Token, reason, q.cfg.MaxAttempts).Scan(&f.Attempts, &status)
	if errors.Is(err, pgx.ErrNoRows) {
		return f, ErrClaimLost
	}
	if err != nil {
		return f, fmt.Errorf("mark failed: %w", err)
	}
	f.GaveUp = status == "failed"
	if !f.GaveUp {
		f.RetryIn = q.cfg.Backoff(f.Attempts)
	}
	return f, nil
}

// MarkInvalid fails a domain at once, whatever its attempts: the name is one no CA
// can issue for, and no retry changes that. reason is stored as ssl_error.
func (q *Queue) MarkInvalid(ctx context.Context, c Claim, reason string) error {
	tag, err := q.db.Exec(ctx, `
UPDATE proxy_domains SET
    ssl_status = 'failed', ssl_error = $3,
    ssl_attempts = `+nextAttemptSQL+`,
    updated_at = now(), `+releaseClaimSQL+`
WHERE id = $1 AND ssl_claim_token = $2 AND ssl_status = 'provisioning'`, c.ID, c.Token, reason)
	if err != nil {
		return fmt.Errorf("mark invalid: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrClaimLost
	}
	return nil
}

// Release hands a claim back uncharged: 'pending', the attempt count untouched, and
// ssl_last_attempt_at restored to what it was before the claim, so the domain is
// claimable at once by any instance. Used at shutdown and when the CA rate-limits.
// It notifies in the same transaction: the trigger ignores rows leaving
// 'provisioning' (the worker's own transitions), but a hand-back is for the others.
func (q *Queue) Release(ctx context.Context, c Claim) error {
	return pgx.BeginFunc(ctx, q.db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `
UPDATE proxy_domains SET
    ssl_status = 'pending', ssl_last_attempt_at = $3, updated_at = now(), `+releaseClaimSQL+`
WHERE id = $1 AND ssl_claim_token = $2 AND ssl_status = 'provisioning'`, c.ID, c.Token, c.PrevAttemptAt)
		if err != nil {
			return fmt.Errorf("release: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return ErrClaimLost
		}
		if _, err := tx.Exec(ctx, `SELECT pg_notify('certworker_wake', '')`); err != nil {
			return fmt.Errorf("release: %w", err)
		}
		return nil
	})
}

// PauseCA stops every instance from ordering from directory until until. A later
// pause never shortens an earlier one.
func (q *Queue) PauseCA(ctx context.Context, directory string, until time.Time, reason string) error {
	_, err := q.db.Exec(ctx, `
INSERT INTO certworker_pauses AS p (scope, key, source, paused_until, reason) VALUES ('ca', $1, 'rate_limit', $2, $3)
ON CONFLICT (scope, key, source) DO UPDATE SET
    paused_until = GREATEST(p.paused_until, EXCLUDED.paused_until),
    reason = CASE WHEN EXCLUDED.paused_until > p.paused_until
                  THEN EXCLUDED.reason ELSE p.reason END,
    updated_at = now()`, directory, until, reason)
	if err != nil {
		return fmt.Errorf("pause CA: %w", err)
	}
	return nil
}

// CAPausedUntil is when the pause on directory ends, or the zero time when it is not
// paused now.
func (q *Queue) CAPausedUntil(ctx context.Context, directory string) (time.Time, error) {
	var until time.Time
	err := q.db.QueryRow(ctx, `
SELECT max(paused_until) FROM certworker_pauses WHERE scope = 'ca' AND key = $1 AND paused_until > now() HAVING count(*) > 0`,
		directory).Scan(&until)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("read CA pause: %w", err)
	}
	return until, nil
}
