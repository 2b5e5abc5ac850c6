
UPDATE proxy_domains d SET ssl_status = 'failed', ssl_error = x.reason, updated_at = now()
FROM unnest($1::uuid[], $2::text[]) AS x (id, reason)
WHERE d.id = x.id
RETURNING certworker_domain_event(d.id, d.tenant_id, 'failed', 'too_many_failures', d.ssl_error, now())