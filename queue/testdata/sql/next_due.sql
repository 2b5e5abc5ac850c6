
WITH RECURSIVE held_keys AS (
    (SELECT ssl_held AS k FROM proxy_domains
     WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND ssl_held <> 'backoff' ORDER BY ssl_held LIMIT 1)
    UNION ALL
    SELECT (SELECT ssl_held FROM proxy_domains
            WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND ssl_held <> 'backoff' AND ssl_held > held_keys.k
            ORDER BY ssl_held LIMIT 1)
    FROM held_keys WHERE held_keys.k IS NOT NULL
), per_count AS (
    SELECT k, r.last
    FROM generate_series(0, 7) AS k
    CROSS JOIN LATERAL (
        SELECT ssl_last_attempt_at AS last FROM proxy_domains
        WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND (ssl_held IS NULL OR ssl_held = 'backoff') AND ssl_attempts = k
        ORDER BY ssl_last_attempt_at NULLS FIRST LIMIT 1) r
), queued AS (
    SELECT min(CASE WHEN last IS NULL THEN now()
                    ELSE last + make_interval(secs => LEAST($2 * power(2, LEAST(GREATEST(k, 0), 62)), $3)) END) AS at
    FROM per_count
    UNION ALL
    SELECT min(CASE WHEN ssl_last_attempt_at IS NULL THEN now()
                    ELSE ssl_last_attempt_at + make_interval(secs => LEAST($2 * power(2, LEAST(GREATEST(ssl_attempts, 0), 62)), $3)) END)
    FROM proxy_domains
    WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND (ssl_held IS NULL OR ssl_held = 'backoff') AND (ssl_attempts < 0 OR ssl_attempts >= $5) AND ssl_attempts < $1
    UNION ALL
    (SELECT now() FROM held_keys
     WHERE held_keys.k IS NOT NULL AND held_keys.k NOT IN ('dns', 'routed')
       AND NOT EXISTS (
        SELECT 1 FROM certworker_pauses p
        WHERE p.scope || ':' || p.key = held_keys.k AND p.paused_until > now())
     LIMIT 1)
)
SELECT (EXTRACT(epoch FROM (LEAST(GREATEST(
    LEAST((SELECT min(at) FROM queued),
          (SELECT min(paused_until) FROM certworker_pauses
           WHERE (scope <> 'ca' OR (key = $4 AND source = 'ledger')) AND paused_until > now())),
    (SELECT max(paused_until) FROM certworker_pauses
     WHERE $6 AND scope = 'ca' AND key = $4 AND source <> 'ledger' AND paused_until > now())),
    (SELECT min(ssl_held_until) FROM proxy_domains
     WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND ssl_held = 'routed')))) - EXTRACT(epoch FROM clock_timestamp()))::float8