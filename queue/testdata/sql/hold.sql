
UPDATE proxy_domains SET
    ssl_status = 'pending', ssl_last_attempt_at = ssl_claim_prev_attempt_at, updated_at = now(),
    ssl_claim_token = NULL, ssl_claimed_by = NULL, ssl_lease_expires_at = NULL
WHERE id = $1 AND ssl_claim_token = $2 AND ssl_status = 'provisioning' AND ssl_provider = 'acme'
RETURNING certworker_domain_event(proxy_domains.id, proxy_domains.tenant_id, 'held', $3::text, $4::text, now())