
UPDATE proxy_domains SET ssl_held = 'backoff'
WHERE id = $1::uuid AND verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND ssl_held = 'dns'