
WITH late AS MATERIALIZED (
    SELECT d.ssl_expires_at AS expires
    FROM proxy_domains d
    WHERE d.verification_status = 'verified' AND d.ssl_provider = 'acme'
      AND (d.ssl_status = 'failed' OR (d.ssl_status = 'pending' AND d.ssl_attempts > 0))
      AND d.ssl_expires_at > now()
      AND d.ssl_expires_at <= now() + make_interval(secs => $2)
    UNION ALL
    SELECT d.ssl_expires_at
    FROM proxy_certificates c
    JOIN proxy_domains d ON d.domain = c.domain
    WHERE c.auto_renew AND c.renew_at < now() - interval '1 hour'
      AND d.verification_status = 'verified' AND d.ssl_provider = 'acme'
      AND d.ssl_status = 'active'
      AND d.ssl_expires_at > now()
      AND d.ssl_expires_at <= now() + make_interval(secs => $2)
)
SELECT array_agg((SELECT count(*) FROM late WHERE expires <= now() + make_interval(secs => w)) ORDER BY i)
FROM unnest($1::float8[]) WITH ORDINALITY AS u(w, i)