-- No tenant can harm another (docs/security.md, "What a tenant can and cannot do").
--
-- 1. Case twins: of two verified acme rows whose names differ only in case, the one
--    holding the name's certificate keeps it, else the one that became verified and
--    acme first (queue/twins.go has the rule). That moment is recorded once, in
--    proxy_domains.ssl_eligible_at, by a BEFORE trigger keyed on the proxy's columns,
--    and backfilled here. Rows failed as duplicates by the rule of old (which counted
--    every row of the name, whatever its state) get their name back.
-- 2. The ledger records the tenant of each order (certworker_ledger.tenant_id), so that
--    a tenant's share of an account-wide limit is counted even for the domains it has
--    deleted since (--limit-tenant-reserve).
--
-- Online, as 00014: NO TRANSACTION, every statement can run twice, the new columns are
-- nullable without a default (a catalogue change, no rewrite), ALTER TABLE on a proxy
-- table runs only when the column is missing, every lock is taken under migrate's
-- --lock-timeout, and the backfill of the proxy's table goes in batches of 1,000 rows,
-- each its own transaction, so that no write of the proxy's waits behind it for longer
-- than one batch takes.

-- +goose NO TRANSACTION
-- +goose Up

-- ssl_eligible_at: when the row last entered verification_status 'verified' with
-- ssl_provider 'acme'; NULL outside that state. Written only by the trigger below (and
-- the backfill): ssl_queued_at is stamped again by every failure and hand-back, and
-- created_at is the insert, so neither tells which of two twins was verified first.
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'proxy_domains'::regclass AND NOT attisdropped
                     AND attname = 'ssl_eligible_at') THEN
        ALTER TABLE proxy_domains ADD COLUMN IF NOT EXISTS ssl_eligible_at timestamptz;
    END IF;
END
$$;
-- +goose StatementEnd

-- The trigger: its function is migrations/functions/certworker_eligible_since.sql,
-- which the functions step puts in place of this stub. Keyed on the proxy's columns,
-- and on ssl_eligible_at itself, so that a write of it by anyone is undone (assigning
-- NEW.x needs no column privilege: the proxy's role needs none on certworker's
-- columns). A BEFORE trigger takes no lock of its own.
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regprocedure('public.certworker_eligible_since()') IS NULL THEN
        CREATE FUNCTION public.certworker_eligible_since() RETURNS trigger
        LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END';
        REVOKE ALL ON FUNCTION public.certworker_eligible_since() FROM PUBLIC;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgrelid = 'proxy_domains'::regclass AND tgname = 'certworker_eligible_since') THEN
        CREATE TRIGGER certworker_eligible_since
            BEFORE INSERT OR UPDATE OF verification_status, ssl_provider, ssl_eligible_at ON proxy_domains
            FOR EACH ROW EXECUTE FUNCTION public.certworker_eligible_since();
    END IF;
END
$$;
-- +goose StatementEnd

-- certworker's own columns follow the proxy's writes (functions/certworker_follow_proxy.sql):
-- three triggers keyed on the proxy's columns, so that the tenant operations
-- (SECURITY INVOKER) and the proxy's own updates work under a role that holds no
-- right on certworker's columns (deploy/grants.sql). The WHEN conditions compare the
-- proxy's columns as text, so that they resolve to pg_catalog's operators whatever
-- their type and whatever has been created in public.
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regprocedure('public.certworker_follow_proxy()') IS NULL THEN
        CREATE FUNCTION public.certworker_follow_proxy() RETURNS trigger
        LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END';
        REVOKE ALL ON FUNCTION public.certworker_follow_proxy() FROM PUBLIC;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgrelid = 'proxy_domains'::regclass AND tgname = 'certworker_provider_switched') THEN
        CREATE TRIGGER certworker_provider_switched
            BEFORE UPDATE OF ssl_provider ON proxy_domains
            FOR EACH ROW WHEN (OLD.ssl_provider::text IS DISTINCT FROM NEW.ssl_provider::text)
            EXECUTE FUNCTION public.certworker_follow_proxy('provider');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgrelid = 'proxy_domains'::regclass AND tgname = 'certworker_profile_set') THEN
        CREATE TRIGGER certworker_profile_set
            BEFORE UPDATE OF ssl_profile ON proxy_domains
            FOR EACH ROW EXECUTE FUNCTION public.certworker_follow_proxy('profile');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgrelid = 'proxy_domains'::regclass AND tgname = 'certworker_retried') THEN
        CREATE TRIGGER certworker_retried
            BEFORE UPDATE OF ssl_status, ssl_attempts, ssl_error, ssl_last_attempt_at ON proxy_domains
            FOR EACH ROW WHEN (NEW.ssl_status::text = 'pending' AND NEW.ssl_attempts = 0
                               AND NEW.ssl_error IS NULL AND NEW.ssl_last_attempt_at IS NULL
                               AND OLD.ssl_status::text IN ('failed', 'pending')
                               AND (OLD.ssl_status::text = 'failed' OR OLD.ssl_attempts <> 0
                                    OR OLD.ssl_error IS NOT NULL OR OLD.ssl_last_attempt_at IS NOT NULL))
            EXECUTE FUNCTION public.certworker_follow_proxy('retry');
    END IF;
END
$$;
-- +goose StatementEnd

-- The backfill: a row verified and acme before this migration entered that state at
-- some time after its insert, which is the best that is known of it; the order of the
-- inserts is the order in which two twins were most likely verified. Batches of 1,000,
-- each committed on its own.
-- +goose StatementBegin
DO $$
DECLARE
    n bigint;
BEGIN
    LOOP
        UPDATE proxy_domains d SET ssl_eligible_at = COALESCE(d.created_at, now())
        WHERE d.id IN (SELECT id FROM proxy_domains
                       WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_eligible_at IS NULL
                       LIMIT 1000
                       FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS n = ROW_COUNT;
        COMMIT;
        EXIT WHEN n = 0;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- Rows failed as duplicates by the rule of old: the one that keeps its name by the
-- new rule goes back in the queue, as if retried; the other keeps its failure, in the
-- new words, which no longer name the other row. The same rule as queue/twins.go.
-- +goose StatementBegin
WITH judged AS (
    SELECT d.id,
        (SELECT count(*) FROM proxy_domains o
         WHERE lower(o.domain) = lower(d.domain) AND o.id <> d.id
           AND o.verification_status = 'verified' AND o.ssl_provider = 'acme'
           AND (CASE WHEN EXISTS (SELECT 1 FROM proxy_certificates c WHERE c.domain = o.domain) THEN 0 ELSE 1 END,
                COALESCE(o.ssl_eligible_at, 'infinity'::timestamptz), o.id)
             < (CASE WHEN EXISTS (SELECT 1 FROM proxy_certificates c WHERE c.domain = d.domain) THEN 0 ELSE 1 END,
                COALESCE(d.ssl_eligible_at, 'infinity'::timestamptz), d.id)) = 0 AS keeps
    FROM proxy_domains d
    WHERE d.verification_status = 'verified' AND d.ssl_provider = 'acme'
      AND d.ssl_status = 'failed' AND d.ssl_error LIKE 'duplicate domain: %'
)
UPDATE proxy_domains d SET
    ssl_status = CASE WHEN j.keeps THEN 'pending' ELSE 'failed' END,
    ssl_attempts = CASE WHEN j.keeps THEN 0 ELSE d.ssl_attempts END,
    ssl_last_attempt_at = CASE WHEN j.keeps THEN NULL ELSE d.ssl_last_attempt_at END,
    ssl_error = CASE WHEN j.keeps THEN NULL
                     ELSE 'duplicate domain: the name is held, in another case, by another domain that keeps it; '
                          || 'no certificate is ordered for this one' END,
    updated_at = now()
FROM judged j
WHERE d.id = j.id;
-- +goose StatementEnd

-- certworker_ledger.tenant_id: the tenant of the domain the order was for, as it was
-- when the order was admitted. certworker's own table, no foreign key: a tenant's
-- orders count for the whole window, whatever it deletes meanwhile.
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'certworker_ledger'::regclass AND NOT attisdropped
                     AND attname = 'tenant_id') THEN
        ALTER TABLE certworker_ledger ADD COLUMN IF NOT EXISTS tenant_id uuid;
    END IF;
END
$$;
-- +goose StatementEnd

-- What was known before this migration: the tenant of each domain still there.
UPDATE certworker_ledger l SET tenant_id = d.tenant_id
FROM proxy_domains d
WHERE l.tenant_id IS NULL AND d.id = l.domain_id;

-- The tenant reserve's pauses: scope 'tenant', key the tenant's id. certworker_pauses
-- is certworker's own and small: the constraint is swapped in one transaction, and
-- validated in it.
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = 'certworker_pauses'::regclass AND conname = 'certworker_pauses_scope_check'
                     AND pg_get_constraintdef(oid) LIKE '%tenant%') THEN
        ALTER TABLE certworker_pauses DROP CONSTRAINT IF EXISTS certworker_pauses_scope_check;
        ALTER TABLE certworker_pauses ADD CONSTRAINT certworker_pauses_scope_check
            CHECK (scope IN ('ca', 'registered_domain', 'domain', 'tenant'));
    END IF;
END
$$;
-- +goose StatementEnd

-- Admit counts a tenant's orders in the account's window.
CREATE INDEX CONCURRENTLY IF NOT EXISTS certworker_ledger_tenant_idx
    ON certworker_ledger (directory, tenant_id, at);

-- certworker_enqueue: a SECURITY DEFINER function nothing calls since 00015 (the wake
-- trigger computes places from the rows in line). A definer function is a door: one
-- that is not needed is closed. The Down below creates it again, for 00015's Down,
-- whose wake trigger calls it.
DROP FUNCTION IF EXISTS public.certworker_enqueue(uuid);

-- +goose Down
-- +goose StatementBegin
DO $do$
BEGIN
CREATE OR REPLACE FUNCTION public.certworker_enqueue(p_tenant uuid) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    INSERT INTO public.certworker_tenants AS t (tenant_id, vtime)
    VALUES (p_tenant, COALESCE((SELECT vtime FROM public.certworker_queue_clock WHERE id), 0) + 1)
    ON CONFLICT (tenant_id) DO UPDATE
        SET vtime = GREATEST(t.vtime, COALESCE((SELECT vtime FROM public.certworker_queue_clock WHERE id), 0)) + 1
    RETURNING vtime
$$;
REVOKE ALL ON FUNCTION public.certworker_enqueue(uuid) FROM PUBLIC;
END
$do$;
-- +goose StatementEnd
-- +goose StatementBegin
DO $$
BEGIN
    DELETE FROM certworker_pauses WHERE scope = 'tenant';
    ALTER TABLE certworker_pauses DROP CONSTRAINT IF EXISTS certworker_pauses_scope_check;
    ALTER TABLE certworker_pauses ADD CONSTRAINT certworker_pauses_scope_check
        CHECK (scope IN ('ca', 'registered_domain', 'domain'));
END
$$;
-- +goose StatementEnd
DROP INDEX CONCURRENTLY IF EXISTS certworker_ledger_tenant_idx;
ALTER TABLE certworker_ledger DROP COLUMN IF EXISTS tenant_id;
DROP TRIGGER IF EXISTS certworker_retried ON proxy_domains;
DROP TRIGGER IF EXISTS certworker_profile_set ON proxy_domains;
DROP TRIGGER IF EXISTS certworker_provider_switched ON proxy_domains;
DROP FUNCTION IF EXISTS public.certworker_follow_proxy();
DROP TRIGGER IF EXISTS certworker_eligible_since ON proxy_domains;
DROP FUNCTION IF EXISTS public.certworker_eligible_since();
ALTER TABLE proxy_domains DROP COLUMN IF EXISTS ssl_eligible_at;
