
SELECT now(), u.pending, u.provisioning, u.failed,
       (SELECT count(*) FROM proxy_domains
        WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_expires_at IS NULL)
     + (SELECT count(*) FROM proxy_domains
        WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_expires_at <= now()),
       (SELECT min(ssl_expires_at) FROM proxy_domains
        WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_expires_at > now())
FROM (SELECT count(*) FILTER (WHERE ssl_status = 'pending') AS pending,
             count(*) FILTER (WHERE ssl_status = 'provisioning') AS provisioning,
             count(*) FILTER (WHERE ssl_status = 'failed') AS failed
      FROM proxy_domains WHERE ssl_provider = 'acme' AND ssl_status <> 'active') u