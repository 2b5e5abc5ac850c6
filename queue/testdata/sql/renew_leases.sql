
WITH mine AS (
    SELECT id, ssl_claim_token, COALESCE((CASE WHEN proxy_domains.ssl_lease_expires_at > clock_timestamp() + make_interval(secs => $2)
             THEN '-infinity'::timestamptz ELSE proxy_domains.ssl_lease_expires_at END) > now(), false) AS unexpired
    FROM proxy_domains
    WHERE ssl_status = 'provisioning' AND ssl_claim_token = ANY($1::uuid[])
), live AS (
    SELECT d.id FROM proxy_domains d
    WHERE d.id IN (SELECT id FROM mine WHERE unexpired)
      AND d.ssl_status = 'provisioning' AND d.ssl_claim_token = ANY($1::uuid[])
      AND (CASE WHEN d.ssl_lease_expires_at > clock_timestamp() + make_interval(secs => $2)
             THEN '-infinity'::timestamptz ELSE d.ssl_lease_expires_at END) > now()
    FOR NO KEY UPDATE OF d SKIP LOCKED
), renewed AS (
    UPDATE proxy_domains d SET ssl_lease_expires_at = now() + make_interval(secs => $2)
    FROM live WHERE d.id = live.id
    RETURNING d.id, d.ssl_lease_expires_at
)
SELECT m.ssl_claim_token::text, m.unexpired,
       (SELECT (EXTRACT(epoch FROM (r.ssl_lease_expires_at)) - EXTRACT(epoch FROM clock_timestamp()))::float8 FROM renewed r WHERE r.id = m.id)
FROM mine m