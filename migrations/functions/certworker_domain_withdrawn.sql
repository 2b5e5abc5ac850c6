-- The domain row's: a verified domain that stops being verified, is renamed, or is
-- deleted stops being served at once, not when the readers' caches expire. A domain
-- becoming verified is notified only under a wildcard's row (certworker_domain_verified):
-- otherwise it has no certificate yet (a reader's short miss cache covers the rare
-- manual upload made before verification), and notifying there would put NOTIFY's
-- commit lock back on every "verify", which --wake logical exists to spare.
CREATE OR REPLACE FUNCTION certworker_domain_withdrawn() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM certworker_notify_certificate(OLD.domain);
    RETURN NULL;
END
$$;
