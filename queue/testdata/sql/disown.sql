
UPDATE proxy_domains SET ssl_claim_token = NULL, ssl_claimed_by = NULL, ssl_lease_expires_at = NULL WHERE id = $1 AND ssl_claim_token = $2