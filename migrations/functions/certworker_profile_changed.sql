-- The trigger certworker_profile_changed (BEFORE UPDATE OF ssl_profile on proxy_domains,
-- WHEN an active row's profile changes; migration 00020): an active, verified acme
-- domain whose certificate was issued under another profile than the one it now names
-- goes back to 'pending' with its history cleared (attempts 0, last attempt NULL), so
-- that the next pass replaces the certificate, however ssl_profile was written. The
-- rule is certworker_set_profile's and queue.RequeueProfileChanges's: not for NULL (a
-- changed --acme-profile applies at each renewal), not for a certificate with no
-- recorded profile (it matches any) or with auto_renew off, and not for the profile the
-- CA refused for the domain (ssl_profile_refused: it would be refused again). That
-- refusal is the one the write leaves: certworker_profile_set, which fires after this
-- trigger (BEFORE triggers fire in name order), forgets the refusal of a write of
-- ssl_profile that does not write ssl_profile_refused itself, so a profile written
-- back to the refused one is queued, as certworker_set_profile queues it, for the next
-- order to ask the CA again; judged by the refusal as it was, the row stayed active
-- with the refusal gone, until the housekeeping queued it. Its name sorts before the
-- wake trigger's, which fires after it and sees the row entering the claimable set.
-- Reads only: it takes no lock the proxy's transactions could wait on.
CREATE OR REPLACE FUNCTION public.certworker_profile_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF NEW.ssl_status = 'active' AND NEW.ssl_provider = 'acme' AND NEW.verification_status = 'verified'
       AND NEW.ssl_profile IS NOT NULL
       AND NEW.ssl_profile IS DISTINCT FROM
           (CASE WHEN NEW.ssl_profile_refused IS DISTINCT FROM OLD.ssl_profile_refused THEN NEW.ssl_profile_refused END)
       AND EXISTS (SELECT 1 FROM public.proxy_certificates c
                   WHERE c.domain = NEW.domain AND c.auto_renew
                     AND c.profile IS NOT NULL AND c.profile <> NEW.ssl_profile) THEN
        NEW.ssl_status := 'pending';
        NEW.ssl_attempts := 0;
        NEW.ssl_last_attempt_at := NULL;
    END IF;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION public.certworker_profile_changed() FROM PUBLIC;
