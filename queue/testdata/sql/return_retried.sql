
UPDATE proxy_domains SET ssl_held = 'backoff'
WHERE id IN (SELECT id FROM proxy_domains
             WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND ssl_held = 'dns'
               AND (ssl_error IS NULL OR ssl_error NOT LIKE 'waiting for DNS:%')
             LIMIT $1 FOR UPDATE SKIP LOCKED)