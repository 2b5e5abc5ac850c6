
WITH abandoned AS (
    SELECT id FROM proxy_domains
    WHERE ssl_status = 'provisioning'
      AND ssl_provider = 'acme'
      AND COALESCE((CASE WHEN proxy_domains.ssl_lease_expires_at > clock_timestamp() + make_interval(secs => $5)
             THEN '-infinity'::timestamptz ELSE proxy_domains.ssl_lease_expires_at END),
                   COALESCE(ssl_last_attempt_at, updated_at) + make_interval(secs => $2)) < now()
    LIMIT $4
    FOR UPDATE SKIP LOCKED)
UPDATE proxy_domains d SET
    ssl_status = CASE WHEN (LEAST(GREATEST(ssl_attempts, 0), 2147483646) + 1) >= $1 THEN 'failed' ELSE 'pending' END,
    ssl_attempts = (LEAST(GREATEST(ssl_attempts, 0), 2147483646) + 1),
    ssl_error = $3,
    ssl_last_attempt_at = NULL,
    updated_at = now(), ssl_claim_token = NULL, ssl_claimed_by = NULL, ssl_lease_expires_at = NULL
FROM abandoned
WHERE d.id = abandoned.id
RETURNING d.id::text, d.tenant_id::text, d.domain, d.ssl_attempts, d.ssl_status = 'failed',
    certworker_domain_event(d.id, d.tenant_id, 'failed', 'interrupted', d.ssl_error, now())