
WITH judged AS (
    SELECT d.id, ((SELECT count(*) FROM proxy_domains o
          WHERE lower(o.domain) = lower(d.domain) AND o.id <> d.id AND o.verification_status = 'verified' AND o.ssl_provider = 'acme'
            AND (CASE WHEN EXISTS (SELECT 1 FROM proxy_certificates c WHERE c.domain = o.domain) THEN 0 ELSE 1 END,
         COALESCE(o.ssl_eligible_at, 'infinity'::timestamptz), o.id) < (CASE WHEN EXISTS (SELECT 1 FROM proxy_certificates c WHERE c.domain = d.domain) THEN 0 ELSE 1 END,
         COALESCE(d.ssl_eligible_at, 'infinity'::timestamptz), d.id)) = 0) AS keeps
    FROM proxy_domains d
    WHERE d.id = ANY ($1::uuid[]) AND d.verification_status = 'verified' AND d.ssl_provider = 'acme'
    FOR UPDATE OF d SKIP LOCKED
), lost AS (
    UPDATE proxy_domains d SET
        ssl_status = 'failed', ssl_error = 'duplicate domain: the name is held, in another case, by another domain that keeps it; no certificate is ordered for this one', updated_at = now(), ssl_claim_token = NULL, ssl_claimed_by = NULL, ssl_lease_expires_at = NULL
    FROM judged j WHERE d.id = j.id AND NOT j.keeps AND (d.ssl_status <> 'failed' OR d.ssl_error IS DISTINCT FROM 'duplicate domain: the name is held, in another case, by another domain that keeps it; no certificate is ordered for this one')
    RETURNING d.id, d.tenant_id, d.domain, d.ssl_error, false AS back, certworker_domain_event(d.id, d.tenant_id, 'failed', 'duplicate', d.ssl_error, now()) AS event_id
), back AS (
    UPDATE proxy_domains d SET
        ssl_status = 'pending', ssl_attempts = 0, ssl_error = NULL, ssl_last_attempt_at = NULL, updated_at = now()
    FROM judged j
    WHERE d.id = j.id AND j.keeps AND d.ssl_status = 'failed' AND d.ssl_error LIKE 'duplicate domain: %'
    RETURNING d.id, d.tenant_id, d.domain, 'the name is its own again: back in the queue' AS ssl_error, true AS back,
        certworker_domain_event(d.id, d.tenant_id, 'queued', NULL, 'the name is its own again: back in the queue', now()) AS event_id
)
SELECT id::text, tenant_id::text, domain, ssl_error, back FROM lost
UNION ALL
SELECT id::text, tenant_id::text, domain, ssl_error, back FROM back