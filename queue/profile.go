package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

// A profile per domain. proxy_domains.ssl_profile is the
// tenant's choice (NULL: the worker's --acme-profile); proxy_certificates.profile is
// the profile a certificate was issued under (NULL: not known, which matches any);
// proxy_domains.ssl_profile_refused is the domain's profile the CA does not offer,
// which keeps the worker from trying it, and being refused, on every pass
// (migration 00014).

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

// RefuseProfile records that the CA does not offer the domain's own profile, which
// the claim was to be ordered under, and decides what becomes of the domain, in one statement:
//   - without a certificate, it fails at once ('failed', the attempt counted,
//     reasonNone in ssl_error), and waits for the tenant to change the profile;
//   - with a certificate that is not due for renewal (the claim was a replacement
//     for the profile), it goes back to 'active' with its certificate, reasonKept in
//     ssl_error, the claim dropped and the attempt not counted;
//   - with a certificate due for renewal, it stays claimed, with reasonKept in
//     ssl_error: renew reports true, and the caller orders under the certificate's
//     profile.
//
// Either way ssl_profile_refused records the profile, so that the replacement is not
// tried again until the tenant sets a profile. Nothing is written when the claim is
// no longer held (ErrClaimLost, ErrNotACME).
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

// RequeueProfileChanges moves back to 'pending' the active domains whose certificate
// was issued under another profile than the one they now name, so that the next claim
// replaces the certificate (naming it in "replaces"), and reports how many.
// certworker_set_profile queues such a domain itself, at once (migration 00014, whose
// rule this is too: the two have to agree); this finds the rest, a profile the proxy
// wrote without the function, or set while an order was running (the certificate it
// stored has the old profile), and runs with the housekeeping. The row
// keeps its ssl_renew_by from its certificate, so it is served as a renewal: with time
// to spare, unless its time is short anyway. Its last attempt is cleared, as the
// tenant's retry clears it: the change is a request of the tenant's, not a retry, and
// must not wait out a backoff from the issuance it replaces (a tenant who picks a
// profile minutes after the first certificate).
//
// Not replaced: a domain whose ssl_profile is NULL (a changed --acme-profile applies at
// each renewal, not at once), a certificate with no recorded profile (issued before
// migration 00014, or uploaded: it matches any), a profile the CA refused for the
// domain (ssl_profile_refused: the replacement would be refused again on every
// pass), and a certificate the proxy does not want renewed (auto_renew off).
//
// It reads the domains with a profile of their own through 00014's partial index, in
// batches, so that its cost follows those domains, not the table: 250 ms for 80,000 of
// them among a million domains (BenchmarkPlansAtAMillion, on a 2-core machine at a load
// average of 8), which is why it is not run on every maintenance pass.
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

// SetProfile is the proxy API's profile setting: certworker_set_profile (migration
// 00014), the one implementation the proxy calls too. A nil profile puts the domain
// back on --acme-profile. Returns nil, nil when it is refused: the domain is not the
// tenant's, or the value is not a profile name.
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
