-- A second wake source (issue #5): the worker can learn that a domain is due from a
-- logical replication stream instead of NOTIFY (`certworker run --wake logical`).
-- NOTIFY has a price the proxy pays on every transaction that queues a domain: at
-- commit it takes a lock that is global to the server (PreCommit_Notify locks one
-- shared object for every database), so those commits go one at a time, each
-- holding it across its WAL flush. In logical mode
-- the trigger must not pay it, so whether it notifies becomes a setting, and the
-- publication the logical waker reads is created here. All additive: with the
-- defaults the trigger behaves exactly as migration 00002's.

-- +goose Up

-- Which wake source the workers run with, written by `certworker run` at start
-- (listener.SetMode) and read by the trigger below. One row at most (the primary key
-- can only be true); no row means 'notify', the behaviour before this migration.
--
-- A table rather than a GUC set with ALTER DATABASE: it takes effect for every
-- session at the next commit, not for new sessions only, it needs no ownership of
-- the database, and it is transactional.
CREATE TABLE IF NOT EXISTS certworker_settings (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    wake       text NOT NULL DEFAULT 'notify' CHECK (wake IN ('notify', 'logical')),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The trigger runs with the privileges of whoever writes proxy_domains, the proxy's
-- role included, which this migration knows nothing about. Without this grant the
-- proxy's "verify" would fail with "permission denied for table
-- certworker_settings". The table holds one word; reading it discloses nothing.
GRANT SELECT ON certworker_settings TO PUBLIC;

-- The trigger function of migration 00002 (the triggers and their WHEN clauses are
-- unchanged, so it still runs only for a row entering the claimable set). It still
-- stamps ssl_queued_at, which the logical waker's benchmark and the worker's
-- wake_latency read in both modes; it calls pg_notify only in notify mode. The
-- lookup is one index probe of a one-row table per row entering the set, taken by
-- nothing but a transaction that changes the setting, and changes nothing of the
-- NOTIFY path's behaviour: a statement moving many rows still notifies once.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION certworker_queued() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.ssl_queued_at := clock_timestamp();
    IF coalesce((SELECT wake FROM certworker_settings WHERE id), 'notify') = 'notify' THEN
        PERFORM pg_notify('certworker_wake', '');
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- The publication the logical waker streams (listener.Publication). Here rather than
-- created by the waker at start, because CREATE PUBLICATION needs ownership of
-- proxy_domains and CREATE on the database, which the role that migrates has and the
-- role that runs the worker need not; the waker only checks that it exists and says
-- how to create it when it does not.
--
-- Inserts and updates only: a delete or a truncate never puts a row into the
-- claimable set. No column list or row filter, which would need PostgreSQL 15 (the
-- contract allows 13), and a row filter on an updated table must use only
-- replica-identity columns, or the proxy's UPDATEs fail. Publishing updates needs a
-- replica identity, which proxy_domains has: its primary key.
--
-- A publication costs nothing while nobody streams it: with no slot reading it, no
-- write does any work for it. On a server whose wal_level is not logical it is
-- created all the same (PostgreSQL warns, and `--wake logical` refuses to start with
-- the setting to change). A role that may not create it gets a warning instead of a
-- failed migration, so that notify mode, which does not need it, keeps working.
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'certworker_wake') THEN
        CREATE PUBLICATION certworker_wake FOR TABLE proxy_domains
            WITH (publish = 'insert, update');
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE WARNING 'publication certworker_wake not created (%); --wake logical needs it: run CREATE PUBLICATION certworker_wake FOR TABLE proxy_domains WITH (publish = ''insert, update'') as the owner of proxy_domains', SQLERRM;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP PUBLICATION IF EXISTS certworker_wake;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION certworker_queued() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.ssl_queued_at := clock_timestamp();
    PERFORM pg_notify('certworker_wake', '');
    RETURN NEW;
END
$$;
-- +goose StatementEnd

DROP TABLE IF EXISTS certworker_settings;
