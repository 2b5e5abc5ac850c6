-- certworker_domain_claimed(...): records a claim in the domain's history, in the
-- claim's own statement (the claim calls it for each row it takes), and first what
-- the proxy changed since the domain's newest event, which the worker sees only now,
-- each at the time of the change:
--   - verified, at ssl_eligible_at (when the row became verified and acme), when that
--     is later than the newest event, or the domain has none;
--   - retried, at ssl_queued_at (the wake trigger's and the retry trigger's stamp of a
--     row entering the queue), when that is later than the newest event and the
--     newest is a failure or a wait: the proxy's retry or `certworker retry`;
--   - queued, at ssl_queued_at, when that is later than the newest event and the
--     newest is an issuance: a renewal come due, a profile changed.
-- A row handed back enters the queue too, but after a claim or a hold: nothing is
-- written for it. The proxy's own transactions write nothing: only the worker calls
-- this. It sends no notification (certworker_domain_record says why): the worker
-- notifies certworker_domain for the rows it claimed once the claim has committed.
--
-- SECURITY INVOKER, as certworker_domain_event.
CREATE OR REPLACE FUNCTION public.certworker_domain_claimed(
    p_domain_id uuid, p_tenant_id uuid, p_eligible_at timestamptz, p_queued_at timestamptz, p_at timestamptz)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = public, pg_temp
AS $fn$
DECLARE
    v_event text;
    v_last timestamptz;
BEGIN
    SELECT e.event, e.last_at INTO v_event, v_last
    FROM public.certworker_domain_events e
    WHERE e.domain_id = p_domain_id
    ORDER BY e.id DESC LIMIT 1;
    IF p_eligible_at IS NOT NULL AND (v_last IS NULL OR p_eligible_at > v_last) THEN
        PERFORM public.certworker_domain_record(p_domain_id, p_tenant_id, 'verified', NULL, NULL, p_eligible_at);
        v_event := 'verified';
        v_last := p_eligible_at;
    END IF;
    IF p_queued_at IS NOT NULL AND v_last IS NOT NULL AND p_queued_at > v_last THEN
        IF v_event IN ('failed', 'waiting_for_dns') THEN
            PERFORM public.certworker_domain_record(p_domain_id, p_tenant_id, 'retried', NULL, NULL, p_queued_at);
        ELSIF v_event IN ('issued', 'renewed') THEN
            PERFORM public.certworker_domain_record(p_domain_id, p_tenant_id, 'queued', NULL, NULL, p_queued_at);
        END IF;
    END IF;
    RETURN public.certworker_domain_record(p_domain_id, p_tenant_id, 'claimed', NULL, NULL, p_at);
END
$fn$;

COMMENT ON FUNCTION public.certworker_domain_claimed(uuid, uuid, timestamptz, timestamptz, timestamptz) IS
    'Records a claim in the domain''s history, after what the proxy changed since its newest event (verified, retried, queued).';
