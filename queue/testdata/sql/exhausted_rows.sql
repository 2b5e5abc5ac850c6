
SELECT id::text, tenant_id::text, domain, COALESCE(ssl_error, ''), ssl_attempts FROM proxy_domains
WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending'
  AND ssl_attempts >= $1
LIMIT $2
FOR UPDATE SKIP LOCKED