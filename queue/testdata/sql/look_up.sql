
SELECT id::text, tenant_id::text, domain, verification_status, ssl_provider, ssl_status,
    d.verification_status = 'verified' AND d.ssl_provider = 'acme' AND ((SELECT count(*) FROM proxy_domains o
          WHERE lower(o.domain) = lower(d.domain) AND o.id <> d.id AND o.verification_status = 'verified' AND o.ssl_provider = 'acme'
            AND (CASE WHEN EXISTS (SELECT 1 FROM proxy_certificates c WHERE c.domain = o.domain) THEN 0 ELSE 1 END,
         COALESCE(o.ssl_eligible_at, 'infinity'::timestamptz), o.id) < (CASE WHEN EXISTS (SELECT 1 FROM proxy_certificates c WHERE c.domain = d.domain) THEN 0 ELSE 1 END,
         COALESCE(d.ssl_eligible_at, 'infinity'::timestamptz), d.id)) = 0)
FROM proxy_domains d WHERE lower(domain) = lower($1) ORDER BY domain FOR UPDATE