-- certworker_domain_record(...): certworker_domain_event without its notification,
-- for the claim: a transaction that sends NOTIFY takes the database's notification
-- lock at its commit, which the proxy's verifying transactions (the wake trigger
-- notifies) would then queue behind. The worker sends the claim's notifications
-- after its commit (queue.Queue.NotifyDomains).
--
-- SECURITY INVOKER, as certworker_domain_event.
CREATE OR REPLACE FUNCTION public.certworker_domain_record(
    p_domain_id uuid, p_tenant_id uuid, p_event text, p_reason text, p_message text, p_at timestamptz)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = public, pg_temp
AS $fn$
DECLARE
    v_id bigint;
    v_event text;
    v_reason text;
    v_tenant uuid;
BEGIN
    SELECT e.id, e.event, e.reason, e.tenant_id INTO v_id, v_event, v_reason, v_tenant
    FROM public.certworker_domain_events e
    WHERE e.domain_id = p_domain_id
    ORDER BY e.id DESC LIMIT 1;
    IF FOUND AND v_event = p_event AND v_reason IS NOT DISTINCT FROM p_reason AND v_tenant = p_tenant_id THEN
        UPDATE public.certworker_domain_events
        SET count = LEAST(count, 2147483646) + 1, last_at = GREATEST(last_at, p_at), message = p_message
        WHERE id = v_id;
    ELSE
        INSERT INTO public.certworker_domain_events (domain_id, tenant_id, at, event, reason, message, last_at)
        VALUES (p_domain_id, p_tenant_id, p_at, p_event, p_reason, p_message, p_at)
        RETURNING id INTO v_id;
    END IF;
    RETURN v_id;
END
$fn$;

COMMENT ON FUNCTION public.certworker_domain_record(uuid, uuid, text, text, text, timestamptz) IS
    'Records an event of a domain''s history in the caller''s transaction (the worker''s), counting up a repeat, without a notification.';
