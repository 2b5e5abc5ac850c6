
WITH b AS (
    SELECT * FROM unnest($1::uuid[], $2::text[]) AS b (id, reason)
), free AS (
    SELECT c.id FROM proxy_certificates c
    WHERE c.id IN (SELECT id FROM b) AND c.renew_at IS NULL
    FOR UPDATE SKIP LOCKED
), c AS (
    UPDATE proxy_certificates c SET renew_at = now()
    FROM b JOIN free USING (id)
    WHERE c.id = b.id
    RETURNING c.domain, b.reason
), d AS (
    SELECT d.id, c.reason FROM proxy_domains d JOIN c ON d.domain = c.domain
    WHERE d.ssl_status = 'active'
      AND d.ssl_provider = 'acme'
      AND d.verification_status = 'verified'
    FOR UPDATE OF d SKIP LOCKED)
UPDATE proxy_domains x SET
    ssl_status = 'pending', ssl_attempts = 0, ssl_error = d.reason, ssl_renew_by = NULL,
    updated_at = now()
FROM d
WHERE x.id = d.id