
WITH due AS (
    SELECT id, tenant_id, ssl_renew_by FROM proxy_domains
    WHERE ssl_queue_tier = 3 AND verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND ssl_renew_by <= now()
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), placed AS (
    SELECT l.id, GREATEST(
            COALESCE((SELECT COALESCE(d.ssl_queue_seq, 0) FROM proxy_domains d
                      WHERE d.verification_status = 'verified' AND d.ssl_provider = 'acme' AND d.ssl_status = 'pending'
      AND d.ssl_held IS NULL AND COALESCE(d.ssl_queue_tier, 2) = 1
                      ORDER BY COALESCE(d.ssl_queue_tier, 2), COALESCE(d.ssl_queue_seq, 0) LIMIT 1), 0),
            COALESCE((SELECT LEAST(COALESCE(d.ssl_queue_seq, 0), 9223372036854775807 - 1) + 1 FROM proxy_domains d
                      WHERE d.verification_status = 'verified' AND d.ssl_provider = 'acme' AND d.ssl_status = 'pending'
      AND d.ssl_held IS NULL AND d.tenant_id = l.tenant_id AND COALESCE(d.ssl_queue_tier, 2) = 1
                      ORDER BY d.tenant_id DESC, COALESCE(d.ssl_queue_tier, 2) DESC, COALESCE(d.ssl_queue_seq, 0) DESC
                      LIMIT 1), 0))
        + row_number() OVER (PARTITION BY l.tenant_id ORDER BY l.ssl_renew_by, l.id) - 1 AS seq
    FROM due l
)
UPDATE proxy_domains d SET ssl_queue_tier = 1, ssl_queue_seq = p.seq
FROM placed p WHERE d.id = p.id