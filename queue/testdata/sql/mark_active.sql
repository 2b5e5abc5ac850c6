
WITH d AS (
    UPDATE proxy_domains SET
        ssl_status = CASE WHEN (ssl_profile IS NOT NULL AND $13::text IS NOT NULL AND ssl_profile <> $13::text
          AND ssl_profile IS DISTINCT FROM $14::text
          AND COALESCE((SELECT x.auto_renew FROM proxy_certificates x WHERE x.domain = proxy_domains.domain), true)) THEN 'pending' ELSE 'active' END,
        ssl_last_attempt_at = CASE WHEN (ssl_profile IS NOT NULL AND $13::text IS NOT NULL AND ssl_profile <> $13::text
          AND ssl_profile IS DISTINCT FROM $14::text
          AND COALESCE((SELECT x.auto_renew FROM proxy_certificates x WHERE x.domain = proxy_domains.domain), true)) THEN NULL ELSE ssl_last_attempt_at END,
        ssl_expires_at = $3, ssl_attempts = 0,
        ssl_error = CASE WHEN ssl_profile = $14
                         THEN CASE WHEN ssl_error LIKE 'profile: %' THEN ssl_error ELSE $15 END END,
        ssl_profile_refused = CASE WHEN ssl_profile = $14 THEN $14 END,
        ssl_ca_refused = NULL, ssl_ca_refused_cause = NULL,
        ssl_renew_by = $10, updated_at = now(), ssl_claim_token = NULL, ssl_claimed_by = NULL, ssl_lease_expires_at = NULL
    WHERE id = $1 AND ssl_claim_token = $2 AND ssl_status = 'provisioning' AND ssl_provider = 'acme'
    RETURNING domain, certworker_domain_event(proxy_domains.id, proxy_domains.tenant_id, CASE WHEN EXISTS (SELECT 1 FROM proxy_certificates p WHERE p.domain = proxy_domains.domain) THEN 'renewed' ELSE 'issued' END, CASE WHEN ssl_error LIKE 'profile: %' THEN 'profile_unavailable' END, ssl_error, now()) AS event_id
), c AS (
    INSERT INTO proxy_certificates
        (domain, certificate_pem, private_key_pem, expires_at, not_before, issuer, serial, renew_at,
         ari_window_start, ari_window_end, ari_next_at, profile, issuer_directory)
    SELECT d.domain, $4, $5, $3, $6, $7, $8, $9, $16, $11, now() + make_interval(secs => $12), $13, $17 FROM d
    ON CONFLICT (domain) DO UPDATE SET
        certificate_pem = $4, private_key_pem = $5, expires_at = $3, not_before = $6,
        issuer = $7, serial = $8, renew_at = $9, ari_window_start = $16, ari_window_end = $11, ari_next_at = now() + make_interval(secs => $12),
        profile = $13, issuer_directory = $17,
        updated_at = now()
    RETURNING renew_at
), w AS (
    UPDATE certworker_dns_state SET waiting_since = NULL, paced_since = NULL, updated_at = now()
    WHERE domain_id = $1 AND (waiting_since IS NOT NULL OR paced_since IS NOT NULL) AND EXISTS (SELECT 1 FROM d)
), o AS (
    DELETE FROM certworker_orders WHERE domain_id = $1 AND EXISTS (SELECT 1 FROM d)
)
SELECT (EXTRACT(epoch FROM (renew_at)) - EXTRACT(epoch FROM clock_timestamp()))::float8 FROM c