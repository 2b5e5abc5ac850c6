-- A tenant's next place on the fair queue's clock (certworker_tenants). Nothing calls it
-- any more: the wake trigger computes places from the rows in line.
CREATE OR REPLACE FUNCTION public.certworker_enqueue(p_tenant uuid) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    INSERT INTO public.certworker_tenants AS t (tenant_id, vtime)
    VALUES (p_tenant, COALESCE((SELECT vtime FROM public.certworker_queue_clock WHERE id), 0) + 1)
    ON CONFLICT (tenant_id) DO UPDATE
        SET vtime = GREATEST(t.vtime, COALESCE((SELECT vtime FROM public.certworker_queue_clock WHERE id), 0)) + 1
    RETURNING vtime
$$;
REVOKE ALL ON FUNCTION public.certworker_enqueue(uuid) FROM PUBLIC;
