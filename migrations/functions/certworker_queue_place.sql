-- The place in line of a row of tenant p_tenant_id entering tier p_tier: one past
-- the tenant's last row in line in that tier, never before the tier's front (the
-- first row in line), so that a tenant arriving with one domain is served next to the
-- front and one arriving with many takes turns with the others. Clamped below the
-- top of bigint: a hand-edited ssl_queue_seq of 9223372036854775807 must not make the
-- caller's write fail (22003) inside the proxy's transaction; such a row is served
-- last of its tenant's, its tenant's next rows tie with it. The wake trigger
-- (certworker_queued) places a row entering the claimable set with it, and the retry
-- trigger (certworker_follow_proxy) a pending row whose hold it lifts: both must give
-- the same place. The proxy's columns are compared as text, so that pg_catalog's
-- operators are the exact match whatever their type.
--
-- PL/pgSQL, not SQL: a SQL function with a SET clause is not inlined, and its
-- statements were planned again at every call, on the path from a tenant's verify to
-- its claim (wake latency's p50 from 0.5 to 0.9-1.5 ms, bench/wake-latency.txt);
-- PL/pgSQL keeps its plans for the session. No SET clause of its own: both callers pin
-- search_path (public, pg_temp), which it runs under, and a SET costs every verify a
-- save and restore of the setting (about 10 us of the UPDATE's 220). Every name it
-- reads is written public.x, every operator compares pg_catalog's text.
--
-- SECURITY INVOKER: it reads with the rights of its caller (the owner, in the wake
-- trigger, which is SECURITY DEFINER; the role whose write fired the retry trigger,
-- which may read every column it reads), and writes nothing.
CREATE OR REPLACE FUNCTION public.certworker_queue_place(p_tenant_id uuid, p_tier integer) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN GREATEST(
        COALESCE((SELECT COALESCE(d.ssl_queue_seq, 0) FROM public.proxy_domains d
                  WHERE d.verification_status::text = 'verified' AND d.ssl_provider::text = 'acme'
                    AND d.ssl_status::text = 'pending' AND d.ssl_held IS NULL
                    AND COALESCE(d.ssl_queue_tier, 2) = p_tier
                  ORDER BY COALESCE(d.ssl_queue_tier, 2), COALESCE(d.ssl_queue_seq, 0)
                  LIMIT 1), 0),
        COALESCE((SELECT LEAST(COALESCE(d.ssl_queue_seq, 0), 9223372036854775806) + 1 FROM public.proxy_domains d
                  WHERE d.verification_status::text = 'verified' AND d.ssl_provider::text = 'acme'
                    AND d.ssl_status::text = 'pending' AND d.ssl_held IS NULL
                    AND d.tenant_id = p_tenant_id
                    AND COALESCE(d.ssl_queue_tier, 2) = p_tier
                  ORDER BY d.tenant_id DESC, COALESCE(d.ssl_queue_tier, 2) DESC,
                           COALESCE(d.ssl_queue_seq, 0) DESC
                  LIMIT 1), 0));
END
$$;
COMMENT ON FUNCTION public.certworker_queue_place(uuid, integer) IS
    'certworker: the place in line of a row entering the queue (the wake trigger''s, and a retry''s that lifts a hold)';
