
WITH scanned AS (
    SELECT c.id, c.ari_next_at, d.id AS domain_id, d.tenant_id,
           COALESCE(c.expires_at > now() AND c.renew_at IS NOT NULL AND c.auto_renew
                    AND d.ssl_status = 'active' AND d.ssl_provider = 'acme'
                    AND d.verification_status = 'verified', false) AS eligible,
           (d.id IS NULL OR c.expires_at IS NULL OR c.expires_at <= now() OR NOT c.auto_renew) AS finished
    FROM proxy_certificates c LEFT JOIN proxy_domains d ON d.domain = c.domain
    WHERE c.ari_next_at <= now()
    ORDER BY c.ari_next_at
    LIMIT $2
    FOR UPDATE OF c SKIP LOCKED
), ranked AS (
    SELECT id, domain_id, tenant_id, eligible, finished, row_number() OVER (PARTITION BY eligible ORDER BY ari_next_at) AS rank
    FROM scanned
)
UPDATE proxy_certificates c SET ari_next_at = CASE
        WHEN r.eligible THEN now() + make_interval(secs => $3)
        WHEN r.finished THEN NULL
        ELSE now() + make_interval(secs => $4) END
FROM ranked r
WHERE c.id = r.id AND (NOT r.eligible OR r.rank <= $1)
RETURNING r.eligible, c.id::text, r.domain_id::text, r.tenant_id::text, c.domain, CASE WHEN r.eligible THEN c.certificate_pem END,
          COALESCE(c.not_before, c.expires_at), c.expires_at, c.renew_at, now(), c.serial, c.version,
          COALESCE(c.issuer_directory, '')