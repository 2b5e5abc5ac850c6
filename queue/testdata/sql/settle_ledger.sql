
WITH l AS (
    UPDATE certworker_ledger SET outcome = $2 WHERE claim_token = $1 AND outcome IN ('pending', 'unknown')
    RETURNING name, registered_domain, tenant_id, renewal, exempt
), issued AS (
    INSERT INTO certworker_issued_names AS n (directory, name)
    SELECT $3, name FROM l WHERE $2 = 'issued'
    ON CONFLICT (directory, name) DO UPDATE SET issued_at = now()
), lifted AS (
    DELETE FROM certworker_pauses p USING l
    WHERE p.source = 'ledger' AND $2 NOT IN ('pending', 'issued') AND p.directory IN ($3, '')
      AND ((p.scope = 'registered_domain' AND p.key = l.registered_domain)
        OR (p.scope = 'domain' AND p.key = l.name)
        OR (p.scope = 'ca' AND p.key = $3 AND $2 = 'not_sent')
        OR (p.scope = 'tenant' AND p.key = l.tenant_id::text AND $2 = 'not_sent'))
)
SELECT name, registered_domain, renewal, exempt FROM l