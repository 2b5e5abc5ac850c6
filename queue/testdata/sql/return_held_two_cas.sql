
WITH RECURSIVE keys AS (
    (SELECT ssl_held AS k FROM proxy_domains
     WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND ssl_held <> 'backoff' ORDER BY ssl_held LIMIT 1)
    UNION ALL
    SELECT (SELECT ssl_held FROM proxy_domains
            WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND ssl_held <> 'backoff' AND ssl_held > keys.k
            ORDER BY ssl_held LIMIT 1)
    FROM keys WHERE keys.k IS NOT NULL
), cand AS (
    SELECT r.id FROM generate_series(0, 10 - 1) AS k
    CROSS JOIN LATERAL (
        (SELECT id FROM proxy_domains
         WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND ssl_held = 'backoff' AND ssl_attempts = k AND ssl_last_attempt_at IS NULL
         LIMIT 1000)
        UNION ALL
        (SELECT id FROM proxy_domains
         WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND ssl_held = 'backoff' AND ssl_attempts = k
           AND ssl_last_attempt_at < now() - make_interval(secs => LEAST(60::float8 * power(2, LEAST(GREATEST(k, 0), 62)), 14400::float8))
         ORDER BY ssl_last_attempt_at LIMIT 1000)) r
    UNION ALL
    (SELECT id FROM proxy_domains d
     WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND ssl_held = 'backoff' AND ssl_attempts < 0 AND (d.ssl_last_attempt_at IS NULL OR d.ssl_last_attempt_at < now() - make_interval(secs => LEAST(60::float8 * power(2, LEAST(GREATEST(d.ssl_attempts, 0), 62)), 14400::float8)))
     LIMIT 1000)
    UNION ALL
    SELECT r.id FROM keys
    CROSS JOIN LATERAL (
        SELECT id FROM proxy_domains
        WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND ssl_held = keys.k
        LIMIT 1000) r
    WHERE keys.k IS NOT NULL AND keys.k NOT IN ('dns', 'routed') 
    UNION ALL
    (SELECT id FROM proxy_domains
     WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND ssl_held = 'routed' AND ssl_held_until <= now()
     ORDER BY ssl_held_until LIMIT 1000)
    UNION ALL
    (SELECT id FROM proxy_domains
     WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND ssl_held = 'routed'
       AND NOT EXISTS (SELECT 1 FROM certworker_pauses WHERE paused_until > now())
     LIMIT 1000)
    UNION ALL
    (SELECT id FROM proxy_domains
     WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND ssl_held = 'dns'
       AND (ssl_error IS NULL OR ssl_error NOT LIKE 'waiting for DNS:%')
     LIMIT 1000)
), locked AS (
    SELECT d.id, d.tenant_id, COALESCE(d.ssl_queue_tier, 2) AS tier, COALESCE(d.ssl_queue_seq, 0) AS seq,
        (d.ssl_last_attempt_at IS NULL OR d.ssl_last_attempt_at < now() - make_interval(secs => LEAST(60::float8 * power(2, LEAST(GREATEST(d.ssl_attempts, 0), 62)), 14400::float8))) AS ready, NULL::text AS pause
    FROM proxy_domains d
    WHERE d.id = ANY (ARRAY(SELECT id FROM cand LIMIT 1000))
      AND verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND d.ssl_held IS NOT NULL
    FOR UPDATE OF d SKIP LOCKED
), placed AS (
    SELECT l.id, l.ready, l.pause,
        LEAST(certworker_queue_place(l.tenant_id, l.tier)::numeric
              + row_number() OVER (PARTITION BY l.tenant_id, l.tier, (l.ready AND l.pause IS NULL) ORDER BY l.seq, l.id) - 1,
              9223372036854775807)::bigint AS seq
    FROM locked l
)
UPDATE proxy_domains d SET
    ssl_held = CASE WHEN p.pause IS NOT NULL THEN p.pause WHEN NOT p.ready THEN 'backoff' END,
    ssl_held_until = NULL,
    ssl_queue_seq = CASE WHEN p.ready AND p.pause IS NULL THEN p.seq ELSE d.ssl_queue_seq END
FROM placed p
WHERE d.id = p.id AND d.ssl_held IS DISTINCT FROM
    CASE WHEN p.pause IS NOT NULL THEN p.pause WHEN NOT p.ready THEN 'backoff' END