
WITH p AS MATERIALIZED (
    SELECT scope, key, paused_until FROM certworker_pauses
    WHERE paused_until > now() AND (scope = 'ca' AND key = $1 OR scope <> 'ca' AND directory IN ($1, ''))
), queued AS MATERIALIZED (
    SELECT lower(domain) AS name FROM proxy_domains
    WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending'
      AND EXISTS (SELECT 1 FROM p)
)
SELECT
    (SELECT max(paused_until) FROM p WHERE scope = 'ca'),
    (SELECT count(*) FROM queued WHERE EXISTS (SELECT 1 FROM p WHERE scope = 'ca')),
    (SELECT count(*) FROM queued q
     WHERE EXISTS (SELECT 1 FROM p WHERE scope = 'registered_domain' AND strpos(p.key, '.') > 0
                                    AND (q.name = p.key OR right(q.name, length(p.key) + 1) = '.' || p.key))),
    (SELECT count(*) FROM queued q
     WHERE EXISTS (SELECT 1 FROM p WHERE scope = 'domain' AND p.key = q.name))