-- certworker_domain_events_since(p_tenant_id, p_after_id, p_limit): the tenant's
-- events after the id p_after_id (NULL: from the oldest kept), oldest first, at most
-- p_limit (NULL or less than 1: 1000): a proxy that was disconnected reads what it
-- missed, and goes on from the last id returned. Ids are drawn when an event is
-- written, not when it commits, so a reader starts a little before the last id it saw
-- (docs/domain-status.md, "Reading what was missed"). Events are the tenant's as
-- written (tenant_id at the time), also of domains since deleted.
--
-- An event counted up again (a repeat: count and last_at) keeps its id: a reader
-- that must see repeats reads the domain's history (certworker_domain_events) when
-- NOTIFY certworker_domain names it.
--
-- LANGUAGE sql, STABLE, SECURITY INVOKER, without SET, names qualified: a range of
-- certworker_domain_events_tenant with the proxy's rights (deploy/grants.sql).
CREATE OR REPLACE FUNCTION public.certworker_domain_events_since(p_tenant_id uuid, p_after_id bigint, p_limit integer)
RETURNS TABLE (id bigint, domain_id uuid, at timestamptz, event text, reason text, message text, count integer,
               last_at timestamptz)
LANGUAGE sql STABLE SECURITY INVOKER AS $fn$
    SELECT e.id, e.domain_id, e.at, e.event, e.reason, e.message, e.count, e.last_at
    FROM public.certworker_domain_events e
    WHERE e.tenant_id = p_tenant_id AND e.id > COALESCE(p_after_id, 0)
    ORDER BY e.id
    LIMIT CASE WHEN p_limit IS NULL OR p_limit < 1 THEN 1000 ELSE p_limit END
$fn$;

COMMENT ON FUNCTION public.certworker_domain_events_since(uuid, bigint, integer) IS
    'A tenant''s events after an id, oldest first, for a proxy catching up (docs/domain-status.md).';
