-- A domain's state and history for the proxy to show its tenants (docs/domain-status.md).
--
-- certworker_domain_events: what happened to each domain, written by the worker in
-- the transaction of the change it records (certworker_domain_event), read through
-- certworker_domain_events and certworker_domain_events_since. tenant_id is the
-- domain's tenant when the event was written, so that a domain moved to another tenant
-- shows the new one nothing of the old one's history. A repeated event (the same event
-- and reason as the domain's newest) counts up count and last_at instead of adding a
-- row. No foreign key to proxy_domains: a write of certworker's must never wait on the
-- proxy's row locks, and the proxy deletes its rows as it likes; housekeeping prunes.
--
-- Indexes: (domain_id, id) for a domain's history newest first and the cap of rows a
-- domain keeps; (tenant_id, id) for a tenant's events since an id; (at) for the age
-- limit and for finding the domains that gained events lately.
--
-- certworker_settings.dns_target: --dns-target as `run` recorded it, which
-- certworker_domain_status shows tenants as what to point their names at.
--
-- Online: a new table of certworker's own (its indexes built while it is empty), and a
-- nullable column without a default on certworker's own settings table.

-- +goose NO TRANSACTION
-- +goose Up
CREATE TABLE IF NOT EXISTS certworker_domain_events (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    domain_id uuid NOT NULL,
    tenant_id uuid NOT NULL,
    at        timestamptz NOT NULL DEFAULT now(),
    event     text NOT NULL CHECK (event IN ('verified', 'queued', 'claimed', 'waiting_for_dns', 'ordered',
                                             'validated', 'issued', 'renewed', 'held', 'failed', 'retried',
                                             'withdrawn')),
    reason    text,
    message   text,
    count     integer NOT NULL DEFAULT 1,
    last_at   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS certworker_domain_events_domain ON certworker_domain_events (domain_id, id);
CREATE INDEX IF NOT EXISTS certworker_domain_events_tenant ON certworker_domain_events (tenant_id, id);
CREATE INDEX IF NOT EXISTS certworker_domain_events_at ON certworker_domain_events (at);

-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'certworker_settings'::regclass AND NOT attisdropped
                     AND attname = 'dns_target') THEN
        ALTER TABLE certworker_settings ADD COLUMN IF NOT EXISTS dns_target text;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION IF EXISTS certworker_domain_events_since(uuid, bigint, integer);
DROP FUNCTION IF EXISTS certworker_domain_events(uuid, uuid, integer);
DROP FUNCTION IF EXISTS certworker_domain_status(uuid, uuid);
DROP FUNCTION IF EXISTS certworker_domain_claimed(uuid, uuid, timestamptz, timestamptz, timestamptz);
DROP FUNCTION IF EXISTS certworker_domain_event(uuid, uuid, text, text, text, timestamptz);
DROP FUNCTION IF EXISTS certworker_domain_record(uuid, uuid, text, text, text, timestamptz);
DROP FUNCTION IF EXISTS certworker_domain_reason(text);
ALTER TABLE certworker_settings DROP COLUMN IF EXISTS dns_target;
DROP TABLE IF EXISTS certworker_domain_events;
