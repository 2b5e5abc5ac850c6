-- No role borrows certworker's rights (issue 16). A SECURITY DEFINER function runs
-- with the rights of its owner, the role that ran `migrate` (often a superuser), for
-- whoever calls it or fires its trigger. The three that migrations 00005 and 00007
-- created took `SET search_path FROM CURRENT`, the migrating session's path, "$user",
-- public; PostgreSQL searches pg_temp FIRST for tables, views and sequences whenever
-- the path does not name it, and every role may create temporary tables. So a role
-- with no grants at all created a temporary table certworker_tenants with a trigger
-- of its own and called certworker_enqueue: its trigger ran as the owner and read
-- every private key in proxy_certificates. The proxy's role got the same by verifying
-- a domain (the wake trigger calls certworker_enqueue); and writing a certificate, it
-- could have the certificate trigger draw versions from a temporary sequence of its
-- own named certworker_certificate_version_seq, and serve readers an old certificate
-- as the newer.
--
-- The convention every definer function follows from here on (migrations/embed.go
-- states it for later migrations), after PostgreSQL's "Writing SECURITY DEFINER
-- Functions Safely":
--   - SET search_path = public, pg_temp: pg_temp named, and last, so a temporary
--     object never shadows ours (pg_catalog, unnamed, is searched first);
--   - every table, sequence and certworker function it touches written public.x;
--     a built-in that takes an untyped literal for a non-text parameter written
--     pg_catalog.f: on PostgreSQL 13 and 14 every role may create functions in
--     public, and nextval('name') would pick a nextval(text) planted there over
--     pg_catalog.nextval(regclass);
--   - EXECUTE revoked from PUBLIC. A trigger fires its function whatever the
--     writer's rights (EXECUTE is checked when the trigger is created), so the proxy's
--     writes still fire them; what is refused is a role calling the function itself,
--     or attaching it to a table of its own.
--
-- Definer only where the caller lacks the rights: the wake trigger's function and its
-- helper write certworker_tenants, the certificate trigger's draws from a sequence,
-- and neither the proxy nor the workers' role (deploy/grants.sql) holds those rights.
-- The tenant operations the proxy calls, certworker_queue_for_issuance and
-- certworker_update_domain (00006), are SECURITY INVOKER: they do what the proxy's
-- role may do on proxy_domains already, with its rights; their catalogue comments
-- below say so. migrate creates no role: roles belong to the cluster, and are the
-- operator's to manage.
--
-- Online: CREATE OR REPLACE FUNCTION and REVOKE change catalogue rows only (a
-- function's callers take no lock on it), and a trigger picks the new definition up
-- at its next call. One transaction, so that no function is left replaced but still
-- executable by PUBLIC; every statement can run again.

-- +goose Up

-- 00005's, schema-qualified.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.certworker_enqueue(p_tenant uuid) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    INSERT INTO public.certworker_tenants AS t (tenant_id, vtime)
    VALUES (p_tenant, COALESCE((SELECT vtime FROM public.certworker_queue_clock WHERE id), 0) + 1)
    ON CONFLICT (tenant_id) DO UPDATE
        SET vtime = GREATEST(t.vtime, COALESCE((SELECT vtime FROM public.certworker_queue_clock WHERE id), 0)) + 1
    RETURNING vtime
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION public.certworker_enqueue(uuid) FROM PUBLIC;

-- 00005's, schema-qualified. Its trigger (certworker_queued_insert and _update on
-- proxy_domains) is unchanged.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.certworker_queued() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    NEW.ssl_queued_at := clock_timestamp();
    IF NOT (TG_OP = 'UPDATE' AND OLD.ssl_status = 'provisioning'
            AND NEW.ssl_attempts IS NOT DISTINCT FROM OLD.ssl_attempts
            AND NEW.ssl_queue_seq IS NOT NULL) THEN
        NEW.ssl_queue_seq := public.certworker_enqueue(NEW.tenant_id);
    END IF;
    NEW.ssl_queue_tier := CASE WHEN NEW.ssl_renew_by IS NULL THEN 2
                               WHEN NEW.ssl_renew_by <= now() THEN 1
                               ELSE 3 END;
    IF COALESCE(current_setting('certworker.quiet', true), '') <> 'on'
       AND COALESCE((SELECT wake FROM public.certworker_settings WHERE id), 'notify') = 'notify' THEN
        PERFORM pg_notify('certworker_wake', '');
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION public.certworker_queued() FROM PUBLIC;

-- 00007's, schema-qualified; nextval named in pg_catalog (see above). It calls
-- certworker_notify_certificate, which stays SECURITY INVOKER and executable by
-- PUBLIC: the domain trigger's function (certworker_domain_withdrawn, invoker) calls
-- it with the rights of whoever writes proxy_domains. Called from here it runs as
-- this function's owner, under this function's search_path, and it touches no
-- relation: it calls built-ins only, on text it is given.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.certworker_certificate_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM public.certworker_notify_certificate(OLD.domain);
        RETURN OLD;
    END IF;
    NEW.version := pg_catalog.nextval('public.certworker_certificate_version_seq');
    PERFORM public.certworker_notify_certificate(NEW.domain);
    IF TG_OP = 'UPDATE' AND lower(OLD.domain) <> lower(NEW.domain) THEN
        PERFORM public.certworker_notify_certificate(OLD.domain);
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION public.certworker_certificate_changed() FROM PUBLIC;

-- What the proxy's developers see in \df+: these run with the caller's rights.
COMMENT ON FUNCTION public.certworker_queue_for_issuance(uuid, uuid) IS
    'SECURITY INVOKER on purpose: runs with the rights of the caller (the proxy''s role), which must hold SELECT and UPDATE on proxy_domains. Never make it SECURITY DEFINER (migrations/embed.go).';
COMMENT ON FUNCTION public.certworker_update_domain(uuid, uuid, text, text) IS
    'SECURITY INVOKER on purpose: runs with the rights of the caller (the proxy''s role), which must hold SELECT and UPDATE on proxy_domains. Never make it SECURITY DEFINER (migrations/embed.go).';

-- +goose Down
-- Nothing: going back to the definitions above would open the door again. The
-- functions of 00005 and 00007 behave as before this migration.
