
WITH per_count AS (
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
)
SELECT (EXTRACT(epoch FROM (LEAST(GREATEST(
    LEAST((SELECT min(at) FROM queued),
          (SELECT min(paused_until) FROM certworker_pauses
           WHERE (scope <> 'ca' OR (key = $4 AND source = 'ledger')) AND paused_until > now())),
    (SELECT max(paused_until) FROM certworker_pauses
     WHERE $6 AND scope = 'ca' AND key = $4 AND source <> 'ledger' AND paused_until > now())),
    (SELECT min(ssl_held_until) FROM proxy_domains
     WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND ssl_held = 'routed')))) - EXTRACT(epoch FROM clock_timestamp()))::float8