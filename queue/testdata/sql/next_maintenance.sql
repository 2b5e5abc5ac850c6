
SELECT (EXTRACT(epoch FROM (LEAST(
    (SELECT c.renew_at
       FROM proxy_certificates c JOIN proxy_domains d ON d.domain = c.domain
      WHERE c.auto_renew AND c.renew_at IS NOT NULL
        AND d.ssl_status = 'active' AND d.verification_status = 'verified' AND d.ssl_provider = 'acme'
      ORDER BY c.renew_at LIMIT 1),
    (SELECT min(ssl_renew_by) FROM proxy_domains WHERE ssl_queue_tier = 3 AND verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending')))) - EXTRACT(epoch FROM clock_timestamp()))::float8,
    (EXTRACT(epoch FROM (
    (SELECT min(COALESCE((CASE WHEN proxy_domains.ssl_lease_expires_at > clock_timestamp() + make_interval(secs => $2)
             THEN '-infinity'::timestamptz ELSE proxy_domains.ssl_lease_expires_at END),
                         COALESCE(ssl_last_attempt_at, updated_at) + make_interval(secs => $1)))
       FROM proxy_domains WHERE ssl_status = 'provisioning' AND ssl_provider = 'acme'))) - EXTRACT(epoch FROM clock_timestamp()))::float8