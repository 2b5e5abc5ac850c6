-- The trigger function of proxy_certificates (certworker_certificate_insert, _update,
-- _delete): stamps each written row with a new version, and notifies
-- certworker_certificate with the domain (the old one too when a row is renamed), so
-- that every certstore reader drops its copy at once. SECURITY DEFINER, because the
-- proxy's role has no rights on the version sequence.
--
-- It calls certworker_notify_certificate, which stays SECURITY INVOKER and executable
-- by PUBLIC: the domain trigger's function (certworker_domain_withdrawn, invoker)
-- calls it with the rights of whoever writes proxy_domains. Called from here it runs
-- as this function's owner, under this function's search_path, and it touches no
-- relation: it calls built-ins only, on text it is given.
CREATE OR REPLACE FUNCTION public.certworker_certificate_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM public.certworker_notify_certificate(OLD.domain);
        RETURN OLD;
    END IF;
    NEW.version := pg_catalog.nextval('public.certworker_certificate_version_seq');
    PERFORM public.certworker_notify_certificate(NEW.domain);
    IF TG_OP = 'UPDATE' AND lower(OLD.domain) <> lower(NEW.domain) THEN
        PERFORM public.certworker_notify_certificate(OLD.domain);
    END IF;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION public.certworker_certificate_changed() FROM PUBLIC;
