
WITH f AS (
    SELECT * FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[], $4::text[], $5::text[])
        AS f (id, renew_at, not_before, issuer, serial)
), free AS (
    SELECT c.id FROM proxy_certificates c
    WHERE c.id IN (SELECT id FROM f) AND c.renew_at IS NULL
    FOR UPDATE SKIP LOCKED)
UPDATE proxy_certificates c SET
    renew_at = f.renew_at,
    not_before = COALESCE(c.not_before, f.not_before),
    issuer = COALESCE(c.issuer, f.issuer),
    serial = COALESCE(c.serial, f.serial)
FROM f JOIN free USING (id)
WHERE c.id = f.id