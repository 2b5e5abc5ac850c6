
WITH head AS MATERIALIZED (
    SELECT h.*, row_number() OVER () AS rn FROM (
        SELECT d.id, d.tenant_id, COALESCE(d.ssl_queue_tier, 2) AS tier, COALESCE(d.ssl_queue_seq, 0) AS seq,
            (d.ssl_last_attempt_at IS NULL OR d.ssl_last_attempt_at < now() - make_interval(secs => LEAST($2 * power(2, LEAST(GREATEST(d.ssl_attempts, 0), 62)), $3))) AS ready, CASE WHEN EXISTS (SELECT 1 FROM certworker_pauses
                   WHERE (scope <> 'ca' OR (key = $7 AND source = 'ledger')) AND paused_until > now()) THEN
         (SELECT p.scope || ':' || p.key FROM certworker_pauses p
          WHERE ((p.scope IN ('registered_domain', 'domain') AND p.directory IN ($7, '')
                  AND p.key = ANY (certworker_suffixes(d.domain))
                  AND (p.scope = 'registered_domain' OR p.key = lower(d.domain)))
                 OR (p.scope = 'ca' AND p.key = $7 AND p.source = 'ledger')
                 OR (p.scope = 'tenant' AND p.directory = $7
         AND p.key = d.tenant_id::text AND NOT EXISTS (SELECT 1 FROM proxy_certificates x JOIN certworker_issued_names n
                       ON n.directory = $7 AND n.name = lower(x.domain)
               WHERE x.domain = d.domain AND x.certificate_pem <> '')))
            AND p.paused_until > now()
            AND NOT (p.source = 'ledger' AND CASE WHEN p.scope IN ('ca', 'registered_domain')
                                         THEN EXISTS (SELECT 1 FROM proxy_certificates x JOIN certworker_issued_names n
                       ON n.directory = $7 AND n.name = lower(x.domain)
               WHERE x.domain = d.domain AND x.certificate_pem <> '')
                                         ELSE (EXISTS (SELECT 1 FROM proxy_certificates x JOIN certworker_issued_names n
                       ON n.directory = $7 AND n.name = lower(x.domain)
               WHERE x.domain = d.domain AND x.certificate_pem <> '') AND EXISTS (SELECT 1 FROM proxy_certificates x WHERE x.domain = d.domain
               AND x.ari_window_start <= now() AND now() < x.ari_window_end)) END)
          LIMIT 1) END AS pause, ((SELECT count(*) FROM proxy_domains o
          WHERE lower(o.domain) = lower(d.domain) AND o.id <> d.id AND o.verification_status = 'verified' AND o.ssl_provider = 'acme'
            AND (CASE WHEN EXISTS (SELECT 1 FROM proxy_certificates c WHERE c.domain = o.domain) THEN 0 ELSE 1 END,
         COALESCE(o.ssl_eligible_at, 'infinity'::timestamptz), o.id) < (CASE WHEN EXISTS (SELECT 1 FROM proxy_certificates c WHERE c.domain = d.domain) THEN 0 ELSE 1 END,
         COALESCE(d.ssl_eligible_at, 'infinity'::timestamptz), d.id)) = 0) AS keeps
        FROM proxy_domains d
        WHERE d.verification_status = 'verified' AND d.ssl_provider = 'acme' AND d.ssl_status = 'pending'
      AND d.ssl_held IS NULL
          AND COALESCE(d.ssl_queue_tier, 2) BETWEEN $8 AND $9
          AND d.ssl_attempts < $1
          AND NOT EXISTS (SELECT 1 FROM certworker_pauses
                          WHERE scope = 'ca' AND key = $7 AND paused_until > now() AND source <> 'ledger')
        ORDER BY COALESCE(d.ssl_queue_tier, 2), COALESCE(d.ssl_queue_seq, 0), d.ssl_queued_at DESC NULLS LAST
        LIMIT $10
        FOR UPDATE OF d SKIP LOCKED) h
), due AS (
    SELECT id, tenant_id, tier, seq, rn FROM head
    WHERE ready AND pause IS NULL AND keeps
    ORDER BY rn
    LIMIT $6
), turns AS (
    SELECT tenant_id, count(*) AS k FROM due WHERE tier = 1 GROUP BY tenant_id
), picks AS (
    SELECT e.id, e.tenant_id, e.seq, row_number() OVER (PARTITION BY e.tenant_id ORDER BY e.renew_by, e.id) AS r
    FROM turns t CROSS JOIN LATERAL (
        SELECT x.id, x.tenant_id, COALESCE(x.ssl_queue_seq, 0) AS seq, x.ssl_renew_by AS renew_by
        FROM proxy_domains x
        WHERE x.tenant_id = t.tenant_id AND x.ssl_queue_tier = 1
          AND x.verification_status = 'verified' AND x.ssl_provider = 'acme' AND x.ssl_status = 'pending'
          AND x.ssl_held IS NULL AND x.ssl_attempts < $1 AND (x.ssl_last_attempt_at IS NULL OR x.ssl_last_attempt_at < now() - make_interval(secs => LEAST($2 * power(2, LEAST(GREATEST(x.ssl_attempts, 0), 62)), $3)))
          AND CASE WHEN EXISTS (SELECT 1 FROM certworker_pauses
                   WHERE (scope <> 'ca' OR (key = $7 AND source = 'ledger')) AND paused_until > now()) THEN
         (SELECT p.scope || ':' || p.key FROM certworker_pauses p
          WHERE ((p.scope IN ('registered_domain', 'domain') AND p.directory IN ($7, '')
                  AND p.key = ANY (certworker_suffixes(x.domain))
                  AND (p.scope = 'registered_domain' OR p.key = lower(x.domain)))
                 OR (p.scope = 'ca' AND p.key = $7 AND p.source = 'ledger')
                 OR (p.scope = 'tenant' AND p.directory = $7
         AND p.key = x.tenant_id::text AND NOT EXISTS (SELECT 1 FROM proxy_certificates x JOIN certworker_issued_names n
                       ON n.directory = $7 AND n.name = lower(x.domain)
               WHERE x.domain = x.domain AND x.certificate_pem <> '')))
            AND p.paused_until > now()
            AND NOT (p.source = 'ledger' AND CASE WHEN p.scope IN ('ca', 'registered_domain')
                                         THEN EXISTS (SELECT 1 FROM proxy_certificates x JOIN certworker_issued_names n
                       ON n.directory = $7 AND n.name = lower(x.domain)
               WHERE x.domain = x.domain AND x.certificate_pem <> '')
                                         ELSE (EXISTS (SELECT 1 FROM proxy_certificates x JOIN certworker_issued_names n
                       ON n.directory = $7 AND n.name = lower(x.domain)
               WHERE x.domain = x.domain AND x.certificate_pem <> '') AND EXISTS (SELECT 1 FROM proxy_certificates x WHERE x.domain = x.domain
               AND x.ari_window_start <= now() AND now() < x.ari_window_end)) END)
          LIMIT 1) END IS NULL
          AND ((SELECT count(*) FROM proxy_domains o
          WHERE lower(o.domain) = lower(x.domain) AND o.id <> x.id AND o.verification_status = 'verified' AND o.ssl_provider = 'acme'
            AND (CASE WHEN EXISTS (SELECT 1 FROM proxy_certificates c WHERE c.domain = o.domain) THEN 0 ELSE 1 END,
         COALESCE(o.ssl_eligible_at, 'infinity'::timestamptz), o.id) < (CASE WHEN EXISTS (SELECT 1 FROM proxy_certificates c WHERE c.domain = x.domain) THEN 0 ELSE 1 END,
         COALESCE(x.ssl_eligible_at, 'infinity'::timestamptz), x.id)) = 0)
        ORDER BY x.ssl_renew_by, x.id
        LIMIT t.k
        FOR UPDATE OF x SKIP LOCKED) e
), take AS (
    SELECT id, rn FROM due WHERE tier <> 1
    UNION ALL
    SELECT p.id, u.rn
    FROM picks p
    JOIN (SELECT tenant_id, rn, row_number() OVER (PARTITION BY tenant_id ORDER BY rn) AS r
          FROM due WHERE tier = 1) u ON u.tenant_id = p.tenant_id AND u.r = p.r
), moved AS (
    UPDATE proxy_domains d SET ssl_queue_seq = m.seq
    FROM (SELECT a.id, b.seq
          FROM (SELECT id, tenant_id, row_number() OVER (PARTITION BY tenant_id ORDER BY seq, id) AS r
                FROM due WHERE tier = 1 AND id NOT IN (SELECT id FROM picks)) a
          JOIN (SELECT tenant_id, seq, row_number() OVER (PARTITION BY tenant_id ORDER BY seq, id) AS r
                FROM picks WHERE id NOT IN (SELECT id FROM due)) b
            ON a.tenant_id = b.tenant_id AND a.r = b.r) m
    WHERE d.id = m.id
), out AS (
    UPDATE proxy_domains d SET ssl_held = COALESCE(h.pause, 'backoff')
    FROM head h WHERE d.id = h.id AND h.keeps AND (NOT h.ready OR h.pause IS NOT NULL)
    RETURNING d.id
), lost AS (
    UPDATE proxy_domains d SET
        ssl_status = 'failed', ssl_error = 'duplicate domain: the name is held, in another case, by another domain that keeps it; no certificate is ordered for this one', updated_at = now(), ssl_claim_token = NULL, ssl_claimed_by = NULL, ssl_lease_expires_at = NULL
    FROM head h WHERE d.id = h.id AND NOT h.keeps
    RETURNING d.id, certworker_domain_event(d.id, d.tenant_id, 'failed', 'duplicate', d.ssl_error, now()) AS event_id
), claim_at AS MATERIALIZED (
    SELECT clock_timestamp() AS t
), claimed AS (
    UPDATE proxy_domains d SET
        ssl_status = 'provisioning',
        ssl_claim_prev_attempt_at = d.ssl_last_attempt_at,
        ssl_last_attempt_at = (SELECT t FROM claim_at),
        updated_at = (SELECT t FROM claim_at),
        ssl_claim_token = gen_random_uuid(),
        ssl_claimed_by = $4,
        ssl_lease_expires_at = (SELECT t FROM claim_at) + make_interval(secs => $5)
    FROM take
    WHERE d.id = take.id
    RETURNING d.id, d.tenant_id, d.domain, d.ssl_attempts, d.ssl_claim_token, d.ssl_last_attempt_at,
        d.ssl_claim_prev_attempt_at, d.ssl_queued_at, d.ssl_profile, d.ssl_profile_refused,
        COALESCE(d.ssl_queue_tier, 2) = 2 AS first,
        certworker_domain_claimed(d.id, d.tenant_id, d.ssl_eligible_at, d.ssl_queued_at, (SELECT t FROM claim_at)) AS event_id
)
SELECT c.id::text, c.tenant_id::text, c.domain, c.ssl_attempts, c.ssl_claim_token::text, c.ssl_last_attempt_at,
    (CASE WHEN isfinite(GREATEST(c.ssl_queued_at,
             c.ssl_claim_prev_attempt_at + make_interval(secs => LEAST($2 * power(2, LEAST(GREATEST(c.ssl_attempts, 0), 62)), $3)))) THEN GREATEST(c.ssl_queued_at,
             c.ssl_claim_prev_attempt_at + make_interval(secs => LEAST($2 * power(2, LEAST(GREATEST(c.ssl_attempts, 0), 62)), $3))) END),
    COALESCE((SELECT p.certificate_pem FROM proxy_certificates p WHERE p.domain = c.domain), ''),
    c.ssl_profile, c.ssl_profile_refused,
    (SELECT p.profile FROM proxy_certificates p WHERE p.domain = c.domain),
    c.first, CASE WHEN c.id IS NOT NULL THEN $7::text END, ''::text, ''::text, ''::text,
    (SELECT p.issuer_directory FROM proxy_certificates p WHERE p.domain = c.domain),
    n.taken_out, n.read
FROM (SELECT (SELECT count(*) FROM out) + (SELECT count(*) FROM lost) AS taken_out, (SELECT count(*) FROM head) AS read) n
LEFT JOIN (claimed c JOIN take t ON t.id = c.id) ON true
ORDER BY t.rn