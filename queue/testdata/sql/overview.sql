
SELECT d.id::text, d.domain, d.ssl_status, d.ssl_attempts, d.ssl_error, d.ssl_last_attempt_at,
    CASE WHEN d.ssl_status = 'pending' AND d.ssl_attempts < $1
              AND d.verification_status = 'verified' AND d.ssl_provider = 'acme'
         THEN GREATEST(COALESCE(d.ssl_last_attempt_at + make_interval(secs => LEAST($2 * power(2, LEAST(GREATEST(d.ssl_attempts, 0), 62)), $3)), now()),
                       pz.paused_until,
                       (SELECT s.next_check_at FROM certworker_dns_state s
                        WHERE s.domain_id = d.id AND d.ssl_error LIKE 'waiting for DNS:%'))
    END, pz.paused_until, pz.reason,
    d.ssl_profile, (SELECT c.profile FROM proxy_certificates c WHERE c.domain = d.domain)
FROM (
    SELECT id, tenant_id, domain, verification_status, ssl_provider, ssl_status, ssl_attempts, ssl_error,
        ssl_last_attempt_at, ssl_profile FROM proxy_domains
    WHERE ssl_provider = 'acme'
      AND (ssl_status = 'failed' OR (ssl_status = 'pending' AND (ssl_attempts <> 0 OR ssl_error IS NOT NULL)))
    UNION
    SELECT id, tenant_id, domain, verification_status, ssl_provider, ssl_status, ssl_attempts, ssl_error,
        ssl_last_attempt_at, ssl_profile FROM proxy_domains x
    WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending'
      AND EXISTS (SELECT 1 FROM certworker_pauses WHERE scope <> 'ca' AND paused_until > now())
      AND EXISTS (SELECT 1 FROM certworker_pauses p
                  WHERE p.paused_until > now()
                    AND ((p.scope IN ('registered_domain', 'domain')
                          AND p.key = ANY (certworker_suffixes(x.domain))
                          AND (p.scope = 'registered_domain' OR p.key = lower(x.domain)))
                         OR (p.scope = 'tenant' AND p.key = x.tenant_id::text)))
    UNION
    SELECT id, tenant_id, domain, verification_status, ssl_provider, ssl_status, ssl_attempts, ssl_error,
        ssl_last_attempt_at, ssl_profile FROM proxy_domains
    WHERE ssl_profile_refused IS NOT NULL AND ssl_profile = ssl_profile_refused
      AND ssl_provider = 'acme' AND ssl_status = 'active'
) d 
LEFT JOIN LATERAL (
    SELECT p.scope, p.paused_until, p.reason FROM certworker_pauses p
    WHERE p.paused_until > now()
      AND (p.scope = 'ca'
           OR (p.scope = 'tenant' AND p.key = d.tenant_id::text)
           OR (p.scope IN ('registered_domain', 'domain') AND p.key = ANY (certworker_suffixes(d.domain))
               AND (p.scope = 'registered_domain' OR p.key = lower(d.domain))))
    ORDER BY p.paused_until DESC LIMIT 1) pz ON true
WHERE $4::uuid IS NULL OR d.tenant_id = $4::uuid
ORDER BY d.ssl_last_attempt_at DESC NULLS LAST, d.domain
LIMIT $5