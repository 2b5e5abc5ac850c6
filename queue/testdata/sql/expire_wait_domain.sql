
UPDATE proxy_domains SET ssl_status = 'failed', ssl_held = NULL, ssl_error = $2, updated_at = now()
WHERE id = $1::uuid AND verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND ssl_held = 'dns'
RETURNING certworker_domain_event(proxy_domains.id, proxy_domains.tenant_id, 'failed', certworker_domain_reason(proxy_domains.ssl_error), ssl_error, now())