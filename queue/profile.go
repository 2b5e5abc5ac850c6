package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

// A profile per domain: ssl_profile is the tenant's choice (NULL: --acme-profile),
// proxy_certificates.profile the certificate's (NULL matches any), and
// ssl_profile_refused a profile the CA does not offer, not tried again.

var refuseProfileSQL = `
WITH cert AS (
    SELECT bool_or(true) AS held, bool_or(c.renew_at IS NULL OR c.renew_at <= now()) AS due,
        max(c.expires_at) AS expires_at
    FROM proxy_domains x JOIN proxy_certificates c ON c.domain = x.domain
    WHERE x.id = $1
)
UPDATE proxy_domains SET
    ssl_profile_refused = $3,
    ssl_error = CASE WHEN cert.held THEN $5 ELSE $4 END,
    ssl_status = CASE WHEN cert.held IS NULL THEN 'failed' WHEN cert.due THEN 'provisioning' ELSE 'active' END,
    ssl_attempts = CASE WHEN cert.held IS NULL THEN ` + nextAttemptSQL + ` ELSE ssl_attempts END,
    ssl_last_attempt_at = CASE WHEN cert.held AND NOT cert.due THEN ssl_claim_prev_attempt_at
                               ELSE ssl_last_attempt_at END,
    ssl_expires_at = CASE WHEN cert.held AND NOT cert.due THEN COALESCE(cert.expires_at, ssl_expires_at)
                          ELSE ssl_expires_at END,
    ssl_claim_token = CASE WHEN cert.due THEN ssl_claim_token END,
    ssl_claimed_by = CASE WHEN cert.due THEN ssl_claimed_by END,
    ssl_lease_expires_at = CASE WHEN cert.due THEN ssl_lease_expires_at END,
    updated_at = now()
FROM cert
WHERE ` + heldSQL + `
RETURNING ssl_status = 'provisioning'`

// RefuseProfile records that the CA does not offer the claim's profile and decides,
// in one statement: without a certificate the domain fails (reasonNone); with one not
// due, it goes back to 'active' (reasonKept, uncharged); with one due, it stays
// claimed (reasonKept) and renew is true: order under the certificate's profile.
// Nothing is written when the claim is lost (ErrClaimLost, ErrNotACME).
func (q *Queue) RefuseProfile(ctx context.Context, c issuing.Claim, profile, reasonNone, reasonKept string) (renew bool, err error) {
	err = q.db.QueryRow(ctx, refuseProfileSQL, c.ID, c.Token, profile, q.errorText(ctx, reasonNone), q.errorText(ctx, reasonKept)).Scan(&renew)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, q.whyNotHeld(ctx, c)
	}
	if err != nil {
		return false, fmt.Errorf("record a refused profile: %w", err)
	}
	return renew, nil
}

var requeueProfileChangesSQL = `
WITH changed AS (
    SELECT d.id
    FROM proxy_domains d JOIN proxy_certificates c ON c.domain = d.domain
    WHERE d.ssl_profile IS NOT NULL
      AND d.ssl_profile IS DISTINCT FROM d.ssl_profile_refused
      AND d.ssl_status = 'active'
      AND d.ssl_provider = 'acme'
      AND d.verification_status = 'verified'
      AND c.auto_renew
      AND c.profile IS NOT NULL AND c.profile <> d.ssl_profile
    LIMIT $1
    FOR UPDATE OF d SKIP LOCKED)
UPDATE proxy_domains d SET ssl_status = 'pending', ssl_attempts = 0, ssl_last_attempt_at = NULL, updated_at = now()
FROM changed
WHERE d.id = changed.id`

// RequeueProfileChanges requeues the active domains whose certificate has another
// profile than the one they name, which certworker_set_profile did not queue itself
// (a profile written without it, or set mid-order), and reports how many. The row is
// served as a renewal, without a backoff. Not replaced: NULL ssl_profile, a
// certificate with no recorded profile, a refused profile, auto_renew off. Its cost
// (docs/cas.md) puts it with the housekeeping.
func (q *Queue) RequeueProfileChanges(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := q.db.Exec(ctx, requeueProfileChangesSQL, fillBatch)
		if err != nil {
			return total, fmt.Errorf("requeue certificates of a changed profile: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < fillBatch {
			return total, nil
		}
	}
}

var setProfileSQL = `
SELECT ` + domainColumns + ` FROM certworker_set_profile($1, $2, $3)`

// SetProfile is the proxy API's profile setting, certworker_set_profile. A nil
// profile means --acme-profile; nil, nil when refused.
func (q *Queue) SetProfile(ctx context.Context, id, tenantID string, profile *string) (*Domain, error) {
	d, err := scanDomain(q.db.QueryRow(ctx, setProfileSQL, id, tenantID, profile))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("set profile: %w", err)
	}
	return d, nil
}
