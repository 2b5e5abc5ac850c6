-- certworker_domain_events(p_domain_id, p_tenant_id, p_limit): a domain's history,
-- newest first, at most p_limit events (NULL or less than 1: 100, the most a domain
-- keeps). No row for another tenant's domain or an unknown id (the tenant rule of the
-- tenant operations), and only the events written while the domain was this tenant's.
-- count is how many times the event came in a row; at the first, last_at the last.
--
-- LANGUAGE sql, STABLE, SECURITY INVOKER, without SET, names qualified: a probe of
-- certworker_domain_events_domain with the proxy's rights (deploy/grants.sql).
CREATE OR REPLACE FUNCTION public.certworker_domain_events(p_domain_id uuid, p_tenant_id uuid, p_limit integer)
RETURNS TABLE (id bigint, at timestamptz, event text, reason text, message text, count integer, last_at timestamptz)
LANGUAGE sql STABLE SECURITY INVOKER AS $fn$
    SELECT e.id, e.at, e.event, e.reason, e.message, e.count, e.last_at
    FROM public.certworker_domain_events e
    WHERE e.domain_id = p_domain_id AND e.tenant_id = p_tenant_id
      AND EXISTS (SELECT 1 FROM public.proxy_domains d WHERE d.id = p_domain_id AND d.tenant_id = p_tenant_id)
    ORDER BY e.id DESC
    LIMIT CASE WHEN p_limit IS NULL OR p_limit < 1 THEN 100 ELSE p_limit END
$fn$;

COMMENT ON FUNCTION public.certworker_domain_events(uuid, uuid, integer) IS
    'A domain''s history, newest first, for its tenant (docs/domain-status.md); no row for another tenant''s domain.';
