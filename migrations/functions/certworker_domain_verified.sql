-- A name that becomes verified under a wildcard's domain row one label above it is
-- notified to the certificate readers (migration 00024): they stop serving it the
-- wildcard's certificate. Runs as the writer (the proxy), reading one entry of
-- proxy_domains_lower_domain_idx; a name under no wildcard's row notifies nothing.
CREATE OR REPLACE FUNCTION public.certworker_domain_verified() RETURNS trigger
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
DECLARE
    name text := pg_catalog.lower(NEW.domain::text);
    dot integer := pg_catalog.strpos(name, '.');
BEGIN
    IF dot > 0 AND EXISTS (SELECT 1 FROM public.proxy_domains w
                           WHERE pg_catalog.lower(w.domain::text) = '*.' || pg_catalog.substr(name, dot + 1)) THEN
        PERFORM public.certworker_notify_certificate(name);
    END IF;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION public.certworker_domain_verified() FROM PUBLIC;
