
WITH head AS MATERIALIZED (
    SELECT h.*, row_number() OVER () AS rn FROM (
        SELECT d.id, d.tenant_id, d.domain, d.ssl_ca_refused, d.ssl_waiting_since, d.ssl_queued_at,
            d.ssl_last_attempt_at, d.ssl_attempts,
            (d.ssl_last_attempt_at IS NULL OR d.ssl_last_attempt_at < now() - make_interval(secs => LEAST($2 * power(2, LEAST(GREATEST(d.ssl_attempts, 0), 62)), $3))) AS ready, ((SELECT count(*) FROM proxy_domains o
          WHERE lower(o.domain) = lower(d.domain) AND o.id <> d.id AND o.verification_status = 'verified' AND o.ssl_provider = 'acme'
            AND (CASE WHEN EXISTS (SELECT 1 FROM proxy_certificates c WHERE c.domain = o.domain) THEN 0 ELSE 1 END,
         COALESCE(o.ssl_eligible_at, 'infinity'::timestamptz), o.id) < (CASE WHEN EXISTS (SELECT 1 FROM proxy_certificates c WHERE c.domain = d.domain) THEN 0 ELSE 1 END,
         COALESCE(d.ssl_eligible_at, 'infinity'::timestamptz), d.id)) = 0) AS keeps
        FROM proxy_domains d
        WHERE d.verification_status = 'verified' AND d.ssl_provider = 'acme' AND d.ssl_status = 'pending'
      AND d.ssl_held IS NULL
          AND COALESCE(d.ssl_queue_tier, 2) BETWEEN $10 AND $11
          AND d.ssl_attempts < $1
        ORDER BY COALESCE(d.ssl_queue_tier, 2), COALESCE(d.ssl_queue_seq, 0), d.ssl_queued_at DESC NULLS LAST
        LIMIT $12
        FOR UPDATE OF d SKIP LOCKED) h
), routed AS MATERIALIZED (
    SELECT d.id, d.rn, d.ready, d.keeps, r.cause, r.until
    FROM head d
    LEFT JOIN LATERAL (SELECT CASE
        WHEN d.ssl_ca_refused = $7 THEN CASE WHEN sp.until IS NOT NULL THEN 'held' ELSE 'refused' END
        WHEN hp.source IS NULL THEN NULL
        WHEN d.ssl_ca_refused = $8 THEN 'held'
        WHEN hp.since >= now() - make_interval(secs => $9) AND NOT sc.second THEN 'held'
        WHEN sp.until IS NOT NULL THEN 'held'
        WHEN hp.since >= now() - make_interval(secs => $9) THEN 'renewal'
        WHEN hp.source = 'unreachable' THEN 'outage'
        WHEN hp.source = 'rate_limit' THEN 'rate_limit'
        ELSE 'ledger'
    END AS cause,
    COALESCE(LEAST(hp.paused_until, sp.until,
                   CASE WHEN hp.since + make_interval(secs => $9) > now() THEN hp.since + make_interval(secs => $9) END),
             now() + interval '1 minute') AS until
    FROM (SELECT 1) AS one
    LEFT JOIN LATERAL (
        SELECT p.source, p.paused_until,
               GREATEST(COALESCE(d.ssl_waiting_since, d.ssl_queued_at),
                        d.ssl_last_attempt_at + make_interval(secs => LEAST($2 * power(2, LEAST(GREATEST(d.ssl_attempts, 0), 62)), $3)),
                        COALESCE(p.held_since, p.created_at)) AS since
        FROM certworker_pauses p
        WHERE p.paused_until > now()
  AND ((p.scope = 'ca' AND p.key = $7)
    OR (p.scope IN ('registered_domain', 'domain') AND p.directory IN ($7, '')
        AND p.key = ANY (certworker_suffixes(d.domain))
        AND (p.scope = 'registered_domain' OR p.key = lower(d.domain)))
    OR (p.scope = 'tenant' AND p.directory = $7
         AND p.key = d.tenant_id::text AND NOT EXISTS (SELECT 1 FROM proxy_certificates x JOIN certworker_issued_names n
                       ON n.directory = $7 AND n.name = lower(x.domain)
               WHERE x.domain = d.domain AND x.certificate_pem <> ''
                 AND (x.issuer_directory IS NOT DISTINCT FROM $8) = ($7 = $8))))
  AND NOT (p.source = 'ledger' AND CASE WHEN p.scope IN ('ca', 'registered_domain')
                                         THEN EXISTS (SELECT 1 FROM proxy_certificates x JOIN certworker_issued_names n
                       ON n.directory = $7 AND n.name = lower(x.domain)
               WHERE x.domain = d.domain AND x.certificate_pem <> ''
                 AND (x.issuer_directory IS NOT DISTINCT FROM $8) = ($7 = $8))
                                         ELSE (EXISTS (SELECT 1 FROM proxy_certificates x JOIN certworker_issued_names n
                       ON n.directory = $7 AND n.name = lower(x.domain)
               WHERE x.domain = d.domain AND x.certificate_pem <> ''
                 AND (x.issuer_directory IS NOT DISTINCT FROM $8) = ($7 = $8)) AND EXISTS (SELECT 1 FROM proxy_certificates x WHERE x.domain = d.domain
               AND x.ari_window_start <= now() AND now() < x.ari_window_end)) END)
        ORDER BY 3 LIMIT 1) hp ON true
    LEFT JOIN LATERAL (SELECT min(p.paused_until) AS until FROM certworker_pauses p
        WHERE p.paused_until > now() AND p.directory = $8 AND NOT (p.source = 'ledger' AND CASE WHEN p.scope IN ('ca', 'registered_domain')
                                         THEN EXISTS (SELECT 1 FROM proxy_certificates x JOIN certworker_issued_names n
                       ON n.directory = $8 AND n.name = lower(x.domain)
               WHERE x.domain = d.domain AND x.certificate_pem <> ''
                 AND (x.issuer_directory IS NOT DISTINCT FROM $8) = ($8 = $8))
                                         ELSE (EXISTS (SELECT 1 FROM proxy_certificates x JOIN certworker_issued_names n
                       ON n.directory = $8 AND n.name = lower(x.domain)
               WHERE x.domain = d.domain AND x.certificate_pem <> ''
                 AND (x.issuer_directory IS NOT DISTINCT FROM $8) = ($8 = $8)) AND EXISTS (SELECT 1 FROM proxy_certificates x WHERE x.domain = d.domain
               AND x.ari_window_start <= now() AND now() < x.ari_window_end)) END)
          AND ((p.scope = 'ca' AND p.key = $8)
            OR (p.scope IN ('registered_domain', 'domain')
                AND p.key = ANY (certworker_suffixes(d.domain))
                AND (p.scope = 'registered_domain' OR p.key = lower(d.domain)))
            OR (p.scope = 'tenant' AND p.directory = $8
         AND p.key = d.tenant_id::text AND NOT EXISTS (SELECT 1 FROM proxy_certificates x JOIN certworker_issued_names n
                       ON n.directory = $8 AND n.name = lower(x.domain)
               WHERE x.domain = d.domain AND x.certificate_pem <> ''
                 AND (x.issuer_directory IS NOT DISTINCT FROM $8) = ($8 = $8))))) sp ON true
    LEFT JOIN LATERAL (SELECT EXISTS (SELECT 1 FROM proxy_certificates c
                                      WHERE c.domain = d.domain AND c.issuer_directory = $8) AS second) sc ON true) r ON d.ready AND d.keeps
), due AS (
    SELECT id, rn, cause FROM routed
    WHERE ready AND keeps AND cause IS DISTINCT FROM 'held'
    ORDER BY rn
    LIMIT $6
), out AS (
    UPDATE proxy_domains d SET
        ssl_held = CASE WHEN r.ready THEN 'routed' ELSE 'backoff' END,
        ssl_held_until = CASE WHEN r.ready THEN r.until END
    FROM routed r WHERE d.id = r.id AND r.keeps AND (NOT r.ready OR r.cause = 'held')
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
        ssl_lease_expires_at = (SELECT t FROM claim_at) + make_interval(secs => $5),
        ssl_ca_directory = CASE WHEN due.cause IS NULL THEN $7 ELSE $8 END,
        ssl_ca_cause = due.cause
    FROM due
    WHERE d.id = due.id
    RETURNING d.id, d.tenant_id, d.domain, d.ssl_attempts, d.ssl_claim_token, d.ssl_last_attempt_at,
        d.ssl_claim_prev_attempt_at, d.ssl_queued_at, d.ssl_profile, d.ssl_profile_refused,
        COALESCE(d.ssl_queue_tier, 2) = 2 AS first,
        d.ssl_ca_directory, d.ssl_ca_cause, d.ssl_ca_refused, d.ssl_ca_refused_cause,
        certworker_domain_claimed(d.id, d.tenant_id, d.ssl_eligible_at, d.ssl_queued_at, (SELECT t FROM claim_at)) AS event_id
)
SELECT c.id::text, c.tenant_id::text, c.domain, c.ssl_attempts, c.ssl_claim_token::text, c.ssl_last_attempt_at,
    (CASE WHEN isfinite(GREATEST(c.ssl_queued_at,
             c.ssl_claim_prev_attempt_at + make_interval(secs => LEAST($2 * power(2, LEAST(GREATEST(c.ssl_attempts, 0), 62)), $3)))) THEN GREATEST(c.ssl_queued_at,
             c.ssl_claim_prev_attempt_at + make_interval(secs => LEAST($2 * power(2, LEAST(GREATEST(c.ssl_attempts, 0), 62)), $3))) END),
    COALESCE((SELECT p.certificate_pem FROM proxy_certificates p WHERE p.domain = c.domain), ''),
    c.ssl_profile, c.ssl_profile_refused,
    (SELECT p.profile FROM proxy_certificates p WHERE p.domain = c.domain),
    c.first, c.ssl_ca_directory, c.ssl_ca_cause, c.ssl_ca_refused, c.ssl_ca_refused_cause,
    (SELECT p.issuer_directory FROM proxy_certificates p WHERE p.domain = c.domain),
    n.taken_out, n.read
FROM (SELECT (SELECT count(*) FROM out) + (SELECT count(*) FROM lost) AS taken_out, (SELECT count(*) FROM head) AS read) n
LEFT JOIN (claimed c JOIN due t ON t.id = c.id) ON true
ORDER BY t.rn