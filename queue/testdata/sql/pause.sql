
LEFT JOIN LATERAL (
    SELECT p.scope, p.paused_until, p.reason FROM certworker_pauses p
    WHERE p.paused_until > now()
      AND (p.scope = 'ca'
           OR (p.scope = 'tenant' AND p.key = d.tenant_id::text)
           OR (p.scope IN ('registered_domain', 'domain') AND p.key = ANY (certworker_suffixes(d.domain))
               AND (p.scope = 'registered_domain' OR p.key = lower(d.domain))))
    ORDER BY p.paused_until DESC LIMIT 1) pz ON true