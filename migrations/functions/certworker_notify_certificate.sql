-- Notifies certworker_certificate with a name in lower case. A payload of 8,000
-- bytes or more makes pg_notify raise, which would fail the proxy's own write; no
-- name is that long, but a hand-edited row might be, and the readers' cache expiry
-- covers a name that cannot be notified.
CREATE OR REPLACE FUNCTION certworker_notify_certificate(p_domain text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF octet_length(p_domain) < 8000 THEN
        PERFORM pg_notify('certworker_certificate', lower(p_domain));
    END IF;
END
$$;
