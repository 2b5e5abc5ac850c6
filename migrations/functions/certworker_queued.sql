-- The wake trigger's function (certworker_queued_insert and certworker_queued_update on
-- proxy_domains, BEFORE, WHEN the row enters the claimable set), reading only: it takes
-- no lock the proxy's transactions could wait on. For a row entering the claimable set:
-- stamp ssl_queued_at; its tier; its place, unless it is handed back (leaving
-- 'provisioning' with its attempts unchanged: it keeps its place at the front); in
-- line, unless the write itself took it out (the worker's failure write); notify,
-- unless the write is the worker's own failure write (certworker.quiet). Tier 1 rows
-- get a place too: tenants take turns there (the claim serves each turn with the
-- tenant's earliest expiry).
CREATE OR REPLACE FUNCTION public.certworker_queued() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    NEW.ssl_queued_at := pg_catalog.clock_timestamp();
    NEW.ssl_queue_tier := CASE WHEN NEW.ssl_renew_by IS NULL THEN 2
                               WHEN NEW.ssl_renew_by <= pg_catalog.now() THEN 1
                               ELSE 3 END;
    IF TG_OP = 'INSERT' OR NEW.ssl_held IS NOT DISTINCT FROM OLD.ssl_held THEN
        NEW.ssl_held := NULL;
    END IF;
    IF NOT (TG_OP = 'UPDATE' AND OLD.ssl_status = 'provisioning'
            AND NEW.ssl_attempts IS NOT DISTINCT FROM OLD.ssl_attempts
            AND NEW.ssl_queue_seq IS NOT NULL) THEN
        NEW.ssl_queue_seq := GREATEST(
            COALESCE((SELECT COALESCE(d.ssl_queue_seq, 0) FROM public.proxy_domains d
                      WHERE d.verification_status = 'verified' AND d.ssl_provider = 'acme'
                        AND d.ssl_status = 'pending' AND d.ssl_held IS NULL
                        AND COALESCE(d.ssl_queue_tier, 2) = NEW.ssl_queue_tier
                      ORDER BY COALESCE(d.ssl_queue_tier, 2), COALESCE(d.ssl_queue_seq, 0)
                      LIMIT 1), 0),
            COALESCE((SELECT COALESCE(d.ssl_queue_seq, 0) + 1 FROM public.proxy_domains d
                      WHERE d.verification_status = 'verified' AND d.ssl_provider = 'acme'
                        AND d.ssl_status = 'pending' AND d.ssl_held IS NULL
                        AND d.tenant_id = NEW.tenant_id
                        AND COALESCE(d.ssl_queue_tier, 2) = NEW.ssl_queue_tier
                      ORDER BY d.tenant_id DESC, COALESCE(d.ssl_queue_tier, 2) DESC,
                               COALESCE(d.ssl_queue_seq, 0) DESC
                      LIMIT 1), 0));
    END IF;
    IF COALESCE(pg_catalog.current_setting('certworker.quiet', true), '') <> 'on'
       AND COALESCE((SELECT wake FROM public.certworker_settings WHERE id), 'notify') = 'notify' THEN
        PERFORM pg_catalog.pg_notify('certworker_wake', '');
    END IF;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION public.certworker_queued() FROM PUBLIC;
