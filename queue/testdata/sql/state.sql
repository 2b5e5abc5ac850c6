
SELECT d.id::text, d.tenant_id::text, d.domain, d.verification_status, d.ssl_status, d.ssl_provider,
    d.ssl_attempts, d.ssl_error, d.ssl_last_attempt_at, CASE WHEN d.ssl_status = 'pending' AND d.ssl_attempts < $2
              AND d.verification_status = 'verified' AND d.ssl_provider = 'acme'
         THEN GREATEST(COALESCE(d.ssl_last_attempt_at + make_interval(secs => LEAST($3 * power(2, LEAST(GREATEST(d.ssl_attempts, 0), 62)), $4)), now()),
                       pz.paused_until,
                       (SELECT s.next_check_at FROM certworker_dns_state s
                        WHERE s.domain_id = d.id AND d.ssl_error LIKE 'waiting for DNS:%'))
    END,
    pz.paused_until, pz.reason,
    d.ssl_expires_at, d.ssl_claimed_by, (CASE WHEN isfinite(d.ssl_lease_expires_at) THEN d.ssl_lease_expires_at END), d.ssl_profile, d.ssl_profile_refused,
    c.id IS NOT NULL, c.issuer, c.serial, c.not_before, c.expires_at,
    CASE WHEN c.expires_at IS NULL THEN c.certificate_pem END, c.renew_at, COALESCE(c.auto_renew, false),
    c.profile, c.issuer_directory, d.ssl_ca_directory, d.ssl_ca_cause, d.ssl_ca_refused,
    d.verification_status = 'verified' AND d.ssl_provider = 'acme' AND ((SELECT count(*) FROM proxy_domains o
          WHERE lower(o.domain) = lower(d.domain) AND o.id <> d.id AND o.verification_status = 'verified' AND o.ssl_provider = 'acme'
            AND (CASE WHEN EXISTS (SELECT 1 FROM proxy_certificates c WHERE c.domain = o.domain) THEN 0 ELSE 1 END,
         COALESCE(o.ssl_eligible_at, 'infinity'::timestamptz), o.id) < (CASE WHEN EXISTS (SELECT 1 FROM proxy_certificates c WHERE c.domain = d.domain) THEN 0 ELSE 1 END,
         COALESCE(d.ssl_eligible_at, 'infinity'::timestamptz), d.id)) = 0),
    ds.challenge, ds.challenge_reason
FROM proxy_domains d LEFT JOIN proxy_certificates c ON c.domain = d.domain
LEFT JOIN certworker_dns_state ds ON ds.domain_id = d.id 
LEFT JOIN LATERAL (
    SELECT p.scope, p.paused_until, p.reason FROM certworker_pauses p
    WHERE p.paused_until > now()
      AND (p.scope = 'ca'
           OR (p.scope = 'tenant' AND p.key = d.tenant_id::text)
           OR (p.scope IN ('registered_domain', 'domain') AND p.key = ANY (certworker_suffixes(d.domain))
               AND (p.scope = 'registered_domain' OR p.key = lower(d.domain))))
    ORDER BY p.paused_until DESC LIMIT 1) pz ON true
WHERE lower(d.domain) = lower($1)
ORDER BY d.domain