
UPDATE proxy_domains SET
    ssl_status = 'failed', ssl_error = $3,
    ssl_attempts = (LEAST(GREATEST(ssl_attempts, 0), 2147483646) + 1),
    updated_at = now(), ssl_claim_token = NULL, ssl_claimed_by = NULL, ssl_lease_expires_at = NULL
WHERE id = $1 AND ssl_claim_token = $2 AND ssl_status = 'provisioning' AND ssl_provider = 'acme'
RETURNING certworker_domain_event(proxy_domains.id, proxy_domains.tenant_id, 'failed', certworker_domain_reason(proxy_domains.ssl_error), ssl_error, now())