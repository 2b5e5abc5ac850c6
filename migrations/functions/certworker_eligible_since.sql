-- The trigger certworker_eligible_since on proxy_domains (BEFORE INSERT, and UPDATE OF
-- verification_status, ssl_provider, ssl_eligible_at): records in ssl_eligible_at
-- when the row enters verification_status 'verified' with ssl_provider 'acme', once,
-- and clears it when the row leaves that state. The case twins' rule
-- (queue/twins.go) reads it: of two verified acme twins without a certificate, the
-- one that became so first keeps the name. A write of ssl_eligible_at while the row
-- stays in the state is undone: the moment it entered stands. A row with none
-- (written before migration 00019, and not backfilled yet) takes the value written,
-- or now.
--
-- When the row leaves that state (unverified, or taken to another provider) it stamps
-- ssl_withdrawn_at, which the worker's maintenance turns into the domain's withdrawn
-- event and clears (queue.Queue.RecordWithdrawals).
--
-- It assigns NEW only: no table is read or written, so SECURITY INVOKER, and no column
-- privilege is needed by the writer. The proxy's columns are compared as text, so
-- that pg_catalog's operators are the exact match whatever their type (a varchar
-- column would otherwise let an operator planted in public win).
CREATE OR REPLACE FUNCTION public.certworker_eligible_since() RETURNS trigger
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    IF NEW.verification_status::text = 'verified' AND NEW.ssl_provider::text = 'acme' THEN
        IF TG_OP = 'INSERT'
           OR OLD.verification_status::text IS DISTINCT FROM 'verified'
           OR OLD.ssl_provider::text IS DISTINCT FROM 'acme' THEN
            NEW.ssl_eligible_at := pg_catalog.clock_timestamp();
        ELSE
            NEW.ssl_eligible_at := COALESCE(OLD.ssl_eligible_at, NEW.ssl_eligible_at, pg_catalog.clock_timestamp());
        END IF;
    ELSE
        IF TG_OP = 'UPDATE' AND OLD.verification_status::text = 'verified' AND OLD.ssl_provider::text = 'acme' THEN
            NEW.ssl_withdrawn_at := pg_catalog.clock_timestamp();
        END IF;
        NEW.ssl_eligible_at := NULL;
    END IF;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION public.certworker_eligible_since() FROM PUBLIC;
COMMENT ON FUNCTION public.certworker_eligible_since() IS
    'certworker: records in ssl_eligible_at when a domain enters verified + acme (the case twins'' rule)';
