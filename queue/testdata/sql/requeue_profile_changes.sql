
WITH changed AS (
    SELECT d.id
    FROM proxy_domains d JOIN proxy_certificates c ON c.domain = d.domain
    WHERE d.ssl_profile IS NOT NULL
      AND d.ssl_profile IS DISTINCT FROM d.ssl_profile_refused
      AND d.ssl_status = 'active'
      AND d.ssl_provider = 'acme'
      AND d.verification_status = 'verified'
      AND c.auto_renew
      AND c.profile IS NOT NULL AND c.profile <> d.ssl_profile
    LIMIT $1
    FOR UPDATE OF d SKIP LOCKED)
UPDATE proxy_domains d SET ssl_status = 'pending', ssl_attempts = 0, ssl_last_attempt_at = NULL, updated_at = now()
FROM changed
WHERE d.id = changed.id