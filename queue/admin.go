package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// RefusedError is a retry the domain's state does not allow. Its message is the
// reason, for the operator.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return e.Reason }

// Retry puts a failed or backing-off domain back in the queue now, by name: pending,
// attempts 0, error and last attempt cleared (so the next pass takes it rather than
// waiting out a backoff computed for a cause the operator has just fixed). It
// refuses a domain that is unknown, not verified, not acme, active, or being issued.
// It notifies, so a running worker takes the domain within milliseconds.
func (q *Queue) Retry(ctx context.Context, domain string) error {
	return pgx.BeginFunc(ctx, q.db, func(tx pgx.Tx) error {
		var id, verification, provider, status string
		err := tx.QueryRow(ctx, `
SELECT id::text, verification_status, ssl_provider, ssl_status FROM proxy_domains
WHERE lower(domain) = lower($1) FOR UPDATE`, domain).Scan(&id, &verification, &provider, &status)
		if errors.Is(err, pgx.ErrNoRows) {
			return &RefusedError{fmt.Sprintf("%s: unknown domain", domain)}
		}
		if err != nil {
			return fmt.Errorf("retry: %w", err)
		}
		switch {
		case verification != "verified":
			return &RefusedError{fmt.Sprintf("%s: not verified (verification_status %s); a certificate is only ordered for a verified domain", domain, verification)}
		case provider != "acme":
			return &RefusedError{fmt.Sprintf("%s: its certificate does not come from ACME (ssl_provider %s)", domain, provider)}
		case status == "active":
			return &RefusedError{fmt.Sprintf("%s: already active; it is renewed on its own schedule", domain)}
		case status == "provisioning":
			return &RefusedError{fmt.Sprintf("%s: being issued right now", domain)}
		}
		if err := requeue(ctx, tx, `id = $1`, id); err != nil {
			return err
		}
		return nil
	})
}

// requeueSQL is the one statement that puts a domain back in the queue with its
// history cleared.
const requeueSQL = `
UPDATE proxy_domains SET
    ssl_status = 'pending', ssl_attempts = 0, ssl_error = NULL, ssl_last_attempt_at = NULL,
    updated_at = now()
WHERE `

func requeue(ctx context.Context, tx pgx.Tx, where string, args ...any) error {
	tag, err := tx.Exec(ctx, requeueSQL+where, args...)
	if err != nil {
		return fmt.Errorf("requeue: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	// A pending domain going back to pending does not enter the claimable set, so
	// the trigger is silent: say it here.
	if _, err := tx.Exec(ctx, `SELECT pg_notify('certworker_wake', '')`); err != nil {
		return fmt.Errorf("requeue: %w", err)
	}
	return nil
}

// QueueForIssuance is the proxy API's "retry" (the reference's
// saas::db::queue_for_issuance): requeue domain id of tenantID if it is verified,
// acme, and failed or pending. It reports false, and changes nothing, for any other
// domain, including another tenant's: queueing an unverified domain would order a
// certificate for a name nobody has proved control of, and a tenant must never touch
// another tenant's domain.
func (q *Queue) QueueForIssuance(ctx context.Context, id, tenantID string) (bool, error) {
	err := pgx.BeginFunc(ctx, q.db, func(tx pgx.Tx) error {
		return requeue(ctx, tx, `id = $1 AND tenant_id = $2
  AND verification_status = 'verified' AND ssl_provider = 'acme'
  AND ssl_status IN ('failed', 'pending')`, id, tenantID)
	})
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Domain is a proxy_domains row as the proxy's API shows it.
type Domain struct {
	ID                 string
	TenantID           string
	Domain             string
	VerificationStatus string
	VerificationMethod string
	SSLStatus          string
	SSLProvider        string
	SSLAttempts        int
	SSLError           *string
	SSLLastAttemptAt   *time.Time
	SSLExpiresAt       *time.Time
}

const domainColumns = `id::text, tenant_id::text, domain, verification_status, verification_method,
    ssl_status, ssl_provider, ssl_attempts, ssl_error, ssl_last_attempt_at, ssl_expires_at`

func scanDomain(row pgx.Row) (*Domain, error) {
	var d Domain
	err := row.Scan(&d.ID, &d.TenantID, &d.Domain, &d.VerificationStatus, &d.VerificationMethod,
		&d.SSLStatus, &d.SSLProvider, &d.SSLAttempts, &d.SSLError, &d.SSLLastAttemptAt, &d.SSLExpiresAt)
	if err != nil {
		return nil, err
	}
	return &d, nil
}

// UpdateDomain is the proxy API's domain update (the reference's
// saas::db::update_domain): a nil field is left alone. Changing the provider resets
// the SSL state to a fresh 'pending' with no history, so a domain switched to acme is
// queued (if verified) instead of sitting in whatever state the old provider left it
// in. Returns nil, nil when the domain is not the tenant's.
func (q *Queue) UpdateDomain(ctx context.Context, id, tenantID string, method, provider *string) (*Domain, error) {
	d, err := scanDomain(q.db.QueryRow(ctx, `
UPDATE proxy_domains SET
    verification_method = COALESCE($3, verification_method),
    ssl_status   = CASE WHEN $4::text IS NOT NULL AND $4::text <> ssl_provider THEN 'pending' ELSE ssl_status END,
    ssl_attempts = CASE WHEN $4::text IS NOT NULL AND $4::text <> ssl_provider THEN 0 ELSE ssl_attempts END,
    ssl_error    = CASE WHEN $4::text IS NOT NULL AND $4::text <> ssl_provider THEN NULL ELSE ssl_error END,
    ssl_last_attempt_at = CASE WHEN $4::text IS NOT NULL AND $4::text <> ssl_provider THEN NULL ELSE ssl_last_attempt_at END,
    ssl_provider = COALESCE($4, ssl_provider),
    updated_at = now()
WHERE id = $1 AND tenant_id = $2
RETURNING `+domainColumns, id, tenantID, method, provider))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("update domain: %w", err)
	}
	return d, nil
}
