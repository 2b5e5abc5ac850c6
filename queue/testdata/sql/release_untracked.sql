
UPDATE proxy_domains SET
    ssl_status = 'pending', ssl_last_attempt_at = ssl_claim_prev_attempt_at, updated_at = now(),
    ssl_claim_token = NULL, ssl_claimed_by = NULL, ssl_lease_expires_at = NULL
WHERE ssl_status = 'provisioning' AND ssl_claimed_by = $1
  AND NOT (ssl_claim_token = ANY($2::uuid[]))
RETURNING id::text, tenant_id::text, domain