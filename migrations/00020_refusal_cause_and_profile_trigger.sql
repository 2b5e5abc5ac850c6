-- Two things the proxy's own writes must reach, whoever makes them:
--
-- ssl_ca_refused_cause: why the CA in ssl_ca_refused refused the name: 'caa' when the
-- name's CAA records forbade it (the worker's own CAA check, or the CA's caa problem),
-- 'refused' for a refusal of the CA's own (rejectedIdentifier, unsupportedIdentifier).
-- A CAA record that now allows the CA overrides a refusal CAA caused; the CA's own
-- refusal stands until the proxy's retry or `certworker retry` forgets it. NULL in a
-- row refused before this migration: read as the CA's own.
--
-- certworker_profile_changed: a BEFORE UPDATE OF ssl_profile trigger that puts an active
-- domain whose certificate was issued under another profile back to 'pending' (attempts
-- 0, last attempt NULL), however ssl_profile was written: certworker_set_profile does
-- so itself, and a plain UPDATE was acted on only by the workers' housekeeping, every
-- 10 minutes. BEFORE triggers fire in name order, and this one's name sorts before the
-- wake trigger's (certworker_queued_update), whose WHEN then sees the row entering the
-- claimable set and wakes the workers. The wake trigger itself is left as it is: there
-- is no CREATE OR REPLACE TRIGGER in PostgreSQL 13, and DROP TRIGGER takes an ACCESS
-- EXCLUSIVE lock that blocks the proxy's reads. The body is in
-- migrations/functions/certworker_profile_changed.sql; this creates a stub to attach.
--
-- Online, as 00017: NO TRANSACTION, every statement can run twice, the column is
-- nullable without a default (a catalogue change), ALTER TABLE runs only when it is
-- missing, and every lock is taken under migrate's --lock-timeout.

-- +goose NO TRANSACTION
-- +goose Up

-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'proxy_domains'::regclass AND NOT attisdropped
                     AND attname = 'ssl_ca_refused_cause') THEN
        ALTER TABLE proxy_domains ADD COLUMN IF NOT EXISTS ssl_ca_refused_cause text;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
BEGIN
    IF to_regprocedure('public.certworker_profile_changed()') IS NULL THEN
        CREATE FUNCTION public.certworker_profile_changed() RETURNS trigger
        LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END';
        REVOKE ALL ON FUNCTION public.certworker_profile_changed() FROM PUBLIC;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'certworker_profile_changed'
                   AND tgrelid = 'proxy_domains'::regclass) THEN
        CREATE TRIGGER certworker_profile_changed
            BEFORE UPDATE OF ssl_profile ON proxy_domains
            FOR EACH ROW
            WHEN (NEW.ssl_profile IS DISTINCT FROM OLD.ssl_profile AND NEW.ssl_status = 'active')
            EXECUTE FUNCTION public.certworker_profile_changed();
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP TRIGGER IF EXISTS certworker_profile_changed ON proxy_domains;
DROP FUNCTION IF EXISTS public.certworker_profile_changed();
ALTER TABLE proxy_domains DROP COLUMN IF EXISTS ssl_ca_refused_cause;
