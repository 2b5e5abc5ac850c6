-- BEFORE UPDATE OF certificate_pem on proxy_certificates (certworker_certificate_replaced):
-- a certificate someone else wrote (an upload by hand, the reference worker) forgets
-- everything certworker recorded of the one it replaces: its renewal time, validity,
-- issuer, serial, renewal window, profile and issuing CA. It was not issued through any
-- account certworker knows, and its renewal time is judged again from its own
-- certificate_pem. certworker's own writes set these columns in the same statement.
CREATE OR REPLACE FUNCTION certworker_certificate_replaced() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.renew_at := NULL;
    NEW.not_before := NULL;
    NEW.issuer := NULL;
    NEW.serial := NULL;
    NEW.ari_window_start := NULL;
    NEW.ari_window_end := NULL;
    NEW.ari_next_at := NULL;
    NEW.profile := NULL;
    NEW.issuer_directory := NULL;
    RETURN NEW;
END
$$;
