-- certworker_domain_event(...): records one event of a domain's history
-- (certworker_domain_events), in the caller's transaction: the worker calls it from
-- the statement that makes the change it records, so that the event commits with the
-- change or not at all. A repeated event, the same event, reason and tenant as the
-- domain's newest, counts up that row (count, last_at, message) instead of adding one,
-- so that a long wait checked again and again does not push the history out. Each
-- call sends NOTIFY certworker_domain with the domain's id, delivered at commit.
--
-- SECURITY INVOKER: a caller needs the rights on the table, which the workers' role
-- holds (deploy/grants.sql) and the proxy's does not.
CREATE OR REPLACE FUNCTION public.certworker_domain_event(
    p_domain_id uuid, p_tenant_id uuid, p_event text, p_reason text, p_message text, p_at timestamptz)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = public, pg_temp
AS $fn$
DECLARE
    v_id bigint;
BEGIN
    v_id := public.certworker_domain_record(p_domain_id, p_tenant_id, p_event, p_reason, p_message, p_at);
    PERFORM pg_catalog.pg_notify('certworker_domain', p_domain_id::text);
    RETURN v_id;
END
$fn$;

COMMENT ON FUNCTION public.certworker_domain_event(uuid, uuid, text, text, text, timestamptz) IS
    'Records an event of a domain''s history in the caller''s transaction (the worker''s), counting up a repeat, and notifies certworker_domain.';
