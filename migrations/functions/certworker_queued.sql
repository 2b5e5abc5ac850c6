-- The wake trigger's function (certworker_queued_insert and certworker_queued_update on
-- proxy_domains, BEFORE, WHEN the row enters the claimable set), reading only: it takes
-- no lock the proxy's transactions could wait on. For a row entering the claimable set:
-- stamp ssl_queued_at; its tier; its place and ssl_waiting_since (when its wait for a
-- certificate began), unless it is handed back (leaving 'provisioning' with its
-- attempts unchanged: it keeps its place at the front, and its wait goes on); in
-- line, unless the write itself took it out (the worker's failure write); notify,
-- unless the write is the worker's own failure write (certworker.quiet). Tier 1 rows
-- get a place too: tenants take turns there (the claim serves each turn with the
-- tenant's earliest expiry). A place is one past the tenant's last, clamped below the
-- top of bigint: a hand-edited ssl_queue_seq of 9223372036854775807 must not make the
-- proxy's own verify fail (22003) inside its transaction; such a row is served last
-- of its tenant's, its tenant's next rows tie with it. The proxy's columns are compared
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
        NEW.ssl_queue_seq := GREATEST(
            COALESCE((SELECT COALESCE(d.ssl_queue_seq, 0) FROM public.proxy_domains d
                      WHERE d.verification_status::text = 'verified' AND d.ssl_provider::text = 'acme'
                        AND d.ssl_status::text = 'pending' AND d.ssl_held IS NULL
                        AND COALESCE(d.ssl_queue_tier, 2) = NEW.ssl_queue_tier
                      ORDER BY COALESCE(d.ssl_queue_tier, 2), COALESCE(d.ssl_queue_seq, 0)
                      LIMIT 1), 0),
            COALESCE((SELECT LEAST(COALESCE(d.ssl_queue_seq, 0), 9223372036854775806) + 1 FROM public.proxy_domains d
                      WHERE d.verification_status::text = 'verified' AND d.ssl_provider::text = 'acme'
                        AND d.ssl_status::text = 'pending' AND d.ssl_held IS NULL
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
