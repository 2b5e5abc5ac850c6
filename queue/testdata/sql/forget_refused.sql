
UPDATE proxy_domains SET ssl_ca_refused = NULL, ssl_ca_refused_cause = NULL
WHERE id = $1 AND ssl_claim_token = $2 AND ssl_status = 'provisioning' AND ssl_provider = 'acme'
RETURNING 1