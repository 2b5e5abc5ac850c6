-- The wake trigger's function (certworker_queued_insert and certworker_queued_update on
-- proxy_domains, BEFORE, WHEN the row enters the claimable set), reading only: it takes
-- no lock the proxy's transactions could wait on. For a row entering the claimable set:
-- stamp ssl_queued_at; its tier; its place and ssl_waiting_since (when its wait for a
-- certificate began), unless it is handed back (leaving 'provisioning' with its
-- attempts unchanged: it keeps its place at the front, and its wait goes on); in
-- line, unless the write itself took it out (the worker's failure write); notify,
-- unless the write is the worker's own failure write (certworker.quiet). Tier 1 rows
-- get a place too: tenants take turns there (the claim serves each turn with the
-- tenant's earliest expiry). A place is one past the tenant's last, never before the
-- tier's front (certworker_queue_place, which the retry trigger uses too for a row
-- whose hold it lifts). The proxy's columns are compared
-- as text, so that pg_catalog's operators are the exact match whatever their type (a
-- varchar column would let an operator planted in public win, as the owner).
CREATE OR REPLACE FUNCTION public.certworker_queued() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    NEW.ssl_queued_at := pg_catalog.clock_timestamp();
    NEW.ssl_queue_tier := CASE WHEN NEW.ssl_renew_by IS NULL THEN 2
                               WHEN NEW.ssl_renew_by <= pg_catalog.now() THEN 1
                               ELSE 3 END;
    IF TG_OP = 'INSERT' OR NEW.ssl_held IS NOT DISTINCT FROM OLD.ssl_held THEN
        NEW.ssl_held := NULL;
        NEW.ssl_held_until := NULL;
    END IF;
    IF NOT (TG_OP = 'UPDATE' AND OLD.ssl_status::text = 'provisioning'
            AND NEW.ssl_attempts IS NOT DISTINCT FROM OLD.ssl_attempts
            AND NEW.ssl_waiting_since IS NOT NULL) THEN
        NEW.ssl_waiting_since := NEW.ssl_queued_at;
    END IF;
    IF NOT (TG_OP = 'UPDATE' AND OLD.ssl_status::text = 'provisioning'
            AND NEW.ssl_attempts IS NOT DISTINCT FROM OLD.ssl_attempts
            AND NEW.ssl_queue_seq IS NOT NULL) THEN
        NEW.ssl_queue_seq := public.certworker_queue_place(NEW.tenant_id, NEW.ssl_queue_tier);
    END IF;
    IF COALESCE(pg_catalog.current_setting('certworker.quiet', true), '') <> 'on'
       AND COALESCE((SELECT wake FROM public.certworker_settings WHERE id), 'notify') = 'notify' THEN
        PERFORM pg_catalog.pg_notify('certworker_wake', '');
    END IF;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION public.certworker_queued() FROM PUBLIC;
