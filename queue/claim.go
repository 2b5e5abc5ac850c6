package queue

import (
	"context"
	"fmt"
	"time"
)

// Claim is a domain this instance has claimed and holds a lease on.
type Claim struct {
	ID       string
	TenantID string
	// Domain as stored; CheckName gives the name to order.
	Domain string
	// Attempts before this one (as stored: may be negative in a hand-edited row).
	Attempts int
	// Token identifies this claim; every write that finishes it checks the token.
	Token string
	// ClaimedAt is the claiming transaction's time.
	ClaimedAt time.Time
	// PrevAttemptAt is ssl_last_attempt_at before the claim stamped it, restored
	// when the claim is handed back so that a hand-back costs no backoff.
	PrevAttemptAt *time.Time
	// DueAt is when the row became claimable: when it entered the claimable set, or
	// when its backoff ran out, whichever is later. Zero when unknown.
	DueAt time.Time
	// CurrentPEM is the stored certificate this order renews, or "".
	CurrentPEM string
}

// claimSQL claims up to $6 due domains in one statement.
//
// FOR UPDATE SKIP LOCKED inside the statement that flips the status is what makes
// several instances safe: two cannot claim the same row, and neither blocks on the
// other. The backoff is computed here, from the row's own ssl_attempts, with the same
// parameters as Config.Backoff: it has to be one statement. The reference's first
// version claimed the row (stamping ssl_last_attempt_at) and checked the backoff in a
// second query, against the timestamp it had just overwritten, so every row with a
// failure behind it looked just tried and backoff meant "never retry".
//
// Oldest attempt first, never tried first. The claim stamps ssl_last_attempt_at and
// updated_at with the transaction's time, as the reference does.
var claimSQL = `
WITH due AS (
    SELECT id, ssl_last_attempt_at AS prev_attempt_at, ssl_queued_at,
           CASE WHEN ssl_last_attempt_at IS NULL THEN NULL
                ELSE ssl_last_attempt_at + make_interval(secs => ` + backoffSQL("$2", "$3") + `)
           END AS backoff_due_at
    FROM proxy_domains
    WHERE verification_status = 'verified'
      AND ssl_provider = 'acme'
      AND ssl_status = 'pending'
      AND ssl_attempts < $1
      AND (ssl_last_attempt_at IS NULL
           OR ssl_last_attempt_at < now() - make_interval(secs => ` + backoffSQL("$2", "$3") + `))
    ORDER BY ssl_last_attempt_at ASC NULLS FIRST
    LIMIT $6
    FOR UPDATE SKIP LOCKED
)
UPDATE proxy_domains d SET
    ssl_status = 'provisioning',
    ssl_last_attempt_at = now(),
    updated_at = now(),
    ssl_claim_token = gen_random_uuid(),
    ssl_claimed_by = $4,
    ssl_lease_expires_at = now() + make_interval(secs => $5)
FROM due
WHERE d.id = due.id
RETURNING d.id::text, d.tenant_id::text, d.domain, d.ssl_attempts, d.ssl_claim_token::text,
    d.ssl_last_attempt_at, due.prev_attempt_at,
    GREATEST(due.ssl_queued_at, due.backoff_due_at),
    COALESCE((SELECT c.certificate_pem FROM proxy_certificates c WHERE c.domain = d.domain), '')`

// Claim takes up to limit due domains for owner (an instance name, for operators).
// It returns none when nothing is due.
func (q *Queue) Claim(ctx context.Context, owner string, limit int) ([]Claim, error) {
	if limit <= 0 {
		return nil, nil
	}
	rows, err := q.db.Query(ctx, claimSQL,
		q.cfg.MaxAttempts, seconds(q.cfg.RetryBase), seconds(q.cfg.RetryMax),
		owner, seconds(q.cfg.Lease), limit)
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	defer rows.Close()
	var claims []Claim
	for rows.Next() {
		var c Claim
		var due *time.Time
		if err := rows.Scan(&c.ID, &c.TenantID, &c.Domain, &c.Attempts, &c.Token,
			&c.ClaimedAt, &c.PrevAttemptAt, &due, &c.CurrentPEM); err != nil {
			return nil, fmt.Errorf("claim: %w", err)
		}
		if due != nil {
			c.DueAt = *due
		}
		claims = append(claims, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	return claims, nil
}

// Heartbeat renews the leases of the given claims and returns the tokens that are no
// longer held (requeued by another instance after this one missed its renewals): the
// caller must stop those orders.
func (q *Queue) Heartbeat(ctx context.Context, tokens []string) (lost []string, err error) {
	if len(tokens) == 0 {
		return nil, nil
	}
	rows, err := q.db.Query(ctx, `
UPDATE proxy_domains SET ssl_lease_expires_at = now() + make_interval(secs => $2)
WHERE ssl_status = 'provisioning' AND ssl_claim_token = ANY($1::uuid[])
RETURNING ssl_claim_token::text`, tokens, seconds(q.cfg.Lease))
	if err != nil {
		return nil, fmt.Errorf("renew leases: %w", err)
	}
	defer rows.Close()
	held := make(map[string]bool, len(tokens))
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, fmt.Errorf("renew leases: %w", err)
		}
		held[t] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("renew leases: %w", err)
	}
	for _, t := range tokens {
		if !held[t] {
			lost = append(lost, t)
		}
	}
	return lost, nil
}
