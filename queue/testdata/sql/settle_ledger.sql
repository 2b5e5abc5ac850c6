
WITH l AS (
    UPDATE certworker_ledger SET outcome = $2 WHERE claim_token = $1 AND outcome IN ('pending', 'unknown')
    RETURNING name, registered_domain, tenant_id
), issued AS (
    INSERT INTO certworker_issued_names AS n (directory, name)
    SELECT $3, name FROM l WHERE $2 = 'issued'
    ON CONFLICT (directory, name) DO UPDATE SET issued_at = now()
), lifted AS (
    DELETE FROM certworker_pauses p USING l
    WHERE p.source = 'ledger' AND $2 NOT IN ('pending', 'issued') AND p.directory IN ($3, '')
      AND ((p.scope = 'registered_domain' AND p.key = l.registered_domain)
        OR (p.scope = 'domain' AND p.key = l.name AND $2 <> 'failed_authz')
        OR (p.scope = 'ca' AND p.key = $3 AND $2 = 'not_sent')
        OR (p.scope = 'tenant' AND p.key = l.tenant_id::text AND $2 = 'not_sent'))
), authz AS (
    SELECT l.name, count(*) AS n, min(c.at) + make_interval(secs => $5) AS frees
    FROM l JOIN certworker_ledger c ON c.name = l.name AND c.directory = $3
    WHERE $2 = 'failed_authz' AND $4 > 0 AND c.at > now() - make_interval(secs => $5)
      AND (c.outcome = 'failed_authz' OR c.claim_token = $1)
    GROUP BY l.name
)
INSERT INTO certworker_pauses AS p (directory, scope, key, source, paused_until, reason, held_since)
SELECT $3, 'domain', name, 'ledger', frees,
       format('ledger: %s failed authorizations for %s in %s (--limit-failed-authz-per-name %s)', n, name, $6::text, $7::text),
       now()
FROM authz WHERE n >= $4
ON CONFLICT (directory, scope, key, source) DO UPDATE SET
    held_since = CASE WHEN p.paused_until > now() THEN COALESCE(p.held_since, p.created_at) ELSE now() END,
    paused_until = EXCLUDED.paused_until, reason = EXCLUDED.reason, updated_at = now()