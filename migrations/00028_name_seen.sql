-- The waiting-for-DNS state's new columns (certworker_dns_state, docs/cas.md "Waiting
-- for DNS"):
--
-- seen_at: when the proxy last told certworker_name_seen (migrations/functions/) that a
-- TLS handshake found no certificate for the name. It brings the check forward once a
-- name every 10 s, and the name is checked every 10 s for 2 minutes after.
--
-- taken_until: while a check runs, how long the instance that took it keeps it from the
-- others (the check's bound); NULL when no check runs. certworker_name_seen does not
-- bring forward a check that is running.
--
-- paced_since: the start of the first hour's pace of checks (every 10 s). Unlike
-- waiting_since (the clock of --dns-wait-max, which a retry starts again), a retry
-- keeps it, so a name retried over and over is not checked every 10 s for ever; it
-- starts again when the domain is issued or fails at --dns-wait-max.
--
-- Online: nullable columns without a default on certworker's own table (a catalogue
-- change), added only when missing, so a second run takes no lock.

-- +goose NO TRANSACTION
-- +goose Up
-- +goose StatementBegin
DO $$
DECLARE
    c text;
BEGIN
    FOREACH c IN ARRAY ARRAY['seen_at', 'taken_until', 'paced_since'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_attribute
                       WHERE attrelid = 'certworker_dns_state'::regclass AND NOT attisdropped
                         AND attname = c) THEN
            EXECUTE format('ALTER TABLE certworker_dns_state ADD COLUMN IF NOT EXISTS %I timestamptz', c);
        END IF;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION IF EXISTS public.certworker_name_seen(text);
ALTER TABLE certworker_dns_state DROP COLUMN IF EXISTS seen_at,
    DROP COLUMN IF EXISTS taken_until, DROP COLUMN IF EXISTS paced_since;
