
UPDATE proxy_domains SET ssl_error = $2, updated_at = now()
WHERE id = $1::uuid AND verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND ssl_held = 'dns'
  AND ssl_error LIKE 'waiting for DNS:%' AND ssl_error IS DISTINCT FROM $2
RETURNING certworker_domain_event(proxy_domains.id, proxy_domains.tenant_id, 'waiting_for_dns', certworker_domain_reason(proxy_domains.ssl_error), ssl_error, now())