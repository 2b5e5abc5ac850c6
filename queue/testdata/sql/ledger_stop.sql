
UPDATE proxy_domains SET
    ssl_status = 'failed', ssl_error = $3, updated_at = now(),
    ssl_claim_token = NULL, ssl_claimed_by = NULL, ssl_lease_expires_at = NULL
WHERE id = $1 AND ssl_claim_token = $2 AND ssl_status = 'provisioning' AND ssl_provider = 'acme'