
SELECT ssl_provider FROM proxy_domains WHERE id = $1 AND (ssl_claim_token = $2 OR ssl_claim_token IS NULL)