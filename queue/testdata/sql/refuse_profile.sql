
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
    ssl_attempts = CASE WHEN cert.held IS NULL THEN (LEAST(GREATEST(ssl_attempts, 0), 2147483646) + 1) ELSE ssl_attempts END,
    ssl_last_attempt_at = CASE WHEN cert.held AND NOT cert.due THEN ssl_claim_prev_attempt_at
                               ELSE ssl_last_attempt_at END,
    ssl_expires_at = CASE WHEN cert.held AND NOT cert.due THEN COALESCE(cert.expires_at, ssl_expires_at)
                          ELSE ssl_expires_at END,
    ssl_claim_token = CASE WHEN cert.due THEN ssl_claim_token END,
    ssl_claimed_by = CASE WHEN cert.due THEN ssl_claimed_by END,
    ssl_lease_expires_at = CASE WHEN cert.due THEN ssl_lease_expires_at END,
    updated_at = now()
FROM cert
WHERE id = $1 AND ssl_claim_token = $2 AND ssl_status = 'provisioning' AND ssl_provider = 'acme'
RETURNING ssl_status = 'provisioning'