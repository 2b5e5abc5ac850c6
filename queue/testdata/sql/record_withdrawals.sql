
WITH taken AS (
    SELECT d.id, d.tenant_id, d.ssl_withdrawn_at AS at FROM proxy_domains d
    WHERE d.ssl_withdrawn_at IS NOT NULL
    ORDER BY d.ssl_withdrawn_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), cleared AS (
    UPDATE proxy_domains d SET ssl_withdrawn_at = NULL
    FROM taken WHERE d.id = taken.id
    RETURNING taken.id, taken.tenant_id, taken.at
)
SELECT count(*), count(CASE
    WHEN c.at >= (SELECT e.last_at FROM certworker_domain_events e WHERE e.domain_id = c.id ORDER BY e.id DESC LIMIT 1)
    THEN certworker_domain_event(c.id, c.tenant_id, 'withdrawn', NULL, NULL, c.at) END)
FROM cleared c