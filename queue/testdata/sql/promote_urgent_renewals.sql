
WITH due AS (
    SELECT id, tenant_id, ssl_renew_by FROM proxy_domains
    WHERE ssl_queue_tier = 3 AND verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND ssl_renew_by <= now()
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), placed AS (
    SELECT l.id, certworker_queue_place(l.tenant_id, 1)
        + row_number() OVER (PARTITION BY l.tenant_id ORDER BY l.ssl_renew_by, l.id) - 1 AS seq
    FROM due l
)
UPDATE proxy_domains d SET ssl_queue_tier = 1, ssl_queue_seq = p.seq
FROM placed p WHERE d.id = p.id