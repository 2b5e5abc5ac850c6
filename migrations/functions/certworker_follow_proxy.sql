-- certworker's own columns follow the proxy's writes, set by BEFORE triggers on
-- proxy_domains keyed on the proxy's columns (migration 00019), so that the proxy's
-- role needs no right on certworker's columns (deploy/grants.sql, the proxy's section):
-- assigning NEW.x needs no column privilege, while the tenant operations, which run
-- with the proxy's rights (SECURITY INVOKER), could not UPDATE them. TG_ARGV[0] says
-- which write the trigger follows:
--
--   'provider' (certworker_provider_switched, the provider changed): the claim is
--     dropped, so that an order running for a domain switched away from acme cannot
--     store its result, and a domain switched to acme starts from no claim;
--   'profile' (certworker_profile_set, ssl_profile written): what the worker recorded
--     of a refused profile is forgotten, for the next order to try the one now set;
--   'retry' (certworker_retried, the row's history cleared as the proxy's retry and
--     `certworker retry` clear it: pending, attempts 0, no error, no last attempt,
--     from a failed or backing-off row): every CA's recorded refusal of the name is
--     forgotten, and a hold is lifted, so that the next claim asks again at once; a
--     pending row whose hold is lifted gets a place in line as a row entering the
--     queue does (certworker_queue_place, the wake trigger's own rule).
--
-- It assigns NEW only, and reads proxy_domains only for that place, with the rights
-- of the role whose write fired it: SECURITY INVOKER, with nothing of the caller's it
-- could run (every name qualified, search_path pinned).
CREATE OR REPLACE FUNCTION public.certworker_follow_proxy() RETURNS trigger
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    -- A column the same statement writes itself is left as written (the owner, or
    -- certworker, setting both at once).
    CASE TG_ARGV[0]
        WHEN 'provider' THEN
            IF NEW.ssl_claim_token IS NOT DISTINCT FROM OLD.ssl_claim_token THEN
                NEW.ssl_claim_token := NULL;
                NEW.ssl_claimed_by := NULL;
                NEW.ssl_lease_expires_at := NULL;
            END IF;
        WHEN 'profile' THEN
            IF NEW.ssl_profile_refused IS NOT DISTINCT FROM OLD.ssl_profile_refused THEN
                NEW.ssl_profile_refused := NULL;
            END IF;
        WHEN 'retry' THEN
            IF NEW.ssl_ca_refused IS NOT DISTINCT FROM OLD.ssl_ca_refused THEN
                NEW.ssl_ca_refused := NULL;
                NEW.ssl_ca_refused_cause := NULL;
            END IF;
            IF NEW.ssl_held IS NOT DISTINCT FROM OLD.ssl_held THEN
                NEW.ssl_held := NULL;
                NEW.ssl_held_until := NULL;
            END IF;
            -- A pending row whose hold is lifted enters the line, and takes a place as
            -- a row entering the queue does: the wake trigger fires only for a row
            -- entering the claimable set, which this one never left, and its old place
            -- may be anywhere, far behind the line or ahead of it. Its wait begins again.
            IF OLD.ssl_status::text = 'pending' AND OLD.ssl_held IS NOT NULL AND NEW.ssl_held IS NULL
               AND NEW.verification_status::text = 'verified' AND NEW.ssl_provider::text = 'acme'
               AND NEW.ssl_queue_seq IS NOT DISTINCT FROM OLD.ssl_queue_seq THEN
                NEW.ssl_queued_at := pg_catalog.clock_timestamp();
                NEW.ssl_waiting_since := NEW.ssl_queued_at;
                NEW.ssl_queue_seq := public.certworker_queue_place(NEW.tenant_id, COALESCE(NEW.ssl_queue_tier, 2));
            END IF;
    END CASE;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION public.certworker_follow_proxy() FROM PUBLIC;
COMMENT ON FUNCTION public.certworker_follow_proxy() IS
    'certworker: its own columns follow the proxy''s writes (a provider switched, a profile set, a retry), so the proxy''s role needs no right on them';
