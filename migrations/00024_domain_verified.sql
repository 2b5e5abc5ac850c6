-- certworker_domain_verified: a name that becomes verified (its row verified, inserted
-- verified, or renamed while verified) under a stored wildcard's domain row one label
-- above it (www.shop.example under *.shop.example) is notified to the certificate
-- readers (certworker_certificate), as a withdrawn one is. A name with a verified row
-- of its own is served its own certificate or none, never the wildcard's (docs/
-- proxy-integration.md, "Wildcards and serving"): without the notification, a reader that had served the wildcard for the name
-- went on serving it, another tenant's certificate, until its cache entry was checked
-- again. Only names under a wildcard's row pay for the NOTIFY (its commit lock): a
-- verify of any other name notifies nothing, as before. The body is in
-- migrations/functions/certworker_domain_verified.sql; this creates a stub to attach.
--
-- Online, as 00020: NO TRANSACTION, every statement can run twice, and the trigger's
-- lock (SHARE ROW EXCLUSIVE, a moment) is taken under migrate's --lock-timeout.

-- +goose NO TRANSACTION
-- +goose Up

-- +goose StatementBegin
DO $$
BEGIN
    IF to_regprocedure('public.certworker_domain_verified()') IS NULL THEN
        CREATE FUNCTION public.certworker_domain_verified() RETURNS trigger
        LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END';
        REVOKE ALL ON FUNCTION public.certworker_domain_verified() FROM PUBLIC;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'certworker_domain_verified_update'
                   AND tgrelid = 'proxy_domains'::regclass) THEN
        CREATE TRIGGER certworker_domain_verified_update
            AFTER UPDATE ON proxy_domains
            FOR EACH ROW
            WHEN (NEW.verification_status = 'verified'
                  AND (OLD.verification_status IS DISTINCT FROM NEW.verification_status
                       OR NEW.domain IS DISTINCT FROM OLD.domain))
            EXECUTE FUNCTION public.certworker_domain_verified();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'certworker_domain_verified_insert'
                   AND tgrelid = 'proxy_domains'::regclass) THEN
        CREATE TRIGGER certworker_domain_verified_insert
            AFTER INSERT ON proxy_domains
            FOR EACH ROW
            WHEN (NEW.verification_status = 'verified')
            EXECUTE FUNCTION public.certworker_domain_verified();
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP TRIGGER IF EXISTS certworker_domain_verified_insert ON proxy_domains;
DROP TRIGGER IF EXISTS certworker_domain_verified_update ON proxy_domains;
DROP FUNCTION IF EXISTS public.certworker_domain_verified();
