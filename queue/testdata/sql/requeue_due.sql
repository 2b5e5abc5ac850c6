
WITH due AS (
    SELECT d.id, LEAST(
        CASE WHEN c.not_before IS NULL THEN c.renew_at
             WHEN c.expires_at IS NOT NULL THEN c.expires_at - (c.expires_at - c.not_before) / 5
             WHEN c.renew_at - c.not_before >= make_interval(secs => $2) THEN c.renew_at + (c.renew_at - c.not_before) / 5
             ELSE c.renew_at + (c.renew_at - c.not_before) * 3 / 5 END,
        c.ari_window_end) AS renew_by
    FROM proxy_domains d JOIN proxy_certificates c ON c.domain = d.domain
    WHERE c.auto_renew AND c.renew_at <= now()
      AND d.ssl_status = 'active'
      AND d.ssl_provider = 'acme'
      AND d.verification_status = 'verified'
    LIMIT $1
    FOR UPDATE OF d SKIP LOCKED)
UPDATE proxy_domains d SET
    ssl_status = 'pending', ssl_attempts = 0, updated_at = now(), ssl_renew_by = due.renew_by
FROM due
WHERE d.id = due.id