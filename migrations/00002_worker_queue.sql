-- What the event-driven worker adds to the reference schema: claim leases, the
-- certificate's metadata for renewal, the indexes the claim needs, and the wake
-- trigger (docs/reference.md, "Triggers"). All additive: the proxy keeps working unchanged.
--
-- Online (issue #10): the proxy keeps writing while this runs. ALTER TABLE takes an
-- ACCESS EXCLUSIVE lock even when every column exists already, so it runs only when
-- one is missing; indexes are built CONCURRENTLY (hence NO TRANSACTION); the triggers
-- are created when missing, in one DO block, so that a run that is retried creates
-- them once and never leaves one without the other.

-- +goose NO TRANSACTION
-- +goose Up

-- A claim is a lease, not a mark. The instance that claimed a row renews
-- ssl_lease_expires_at while its order runs; a row whose lease has run out belongs to
-- an instance that died, and the next pass on any instance takes it back. The
-- reference waited a fixed 15 minutes after the claim instead, because it had no way
-- to tell a slow live order from a dead one.
--
-- ssl_queued_at: when the row last entered the claimable set: set by the trigger
-- below, read to measure wake latency (entering the set to being claimed).
-- +goose StatementBegin
DO $$
BEGIN
    IF (SELECT count(*) FROM pg_attribute
        WHERE attrelid = 'proxy_domains'::regclass AND NOT attisdropped
          AND attname IN ('ssl_claim_token', 'ssl_claimed_by', 'ssl_lease_expires_at', 'ssl_queued_at')) < 4 THEN
        ALTER TABLE proxy_domains
            ADD COLUMN IF NOT EXISTS ssl_claim_token uuid,
            ADD COLUMN IF NOT EXISTS ssl_claimed_by text,
            ADD COLUMN IF NOT EXISTS ssl_lease_expires_at timestamptz,
            ADD COLUMN IF NOT EXISTS ssl_queued_at timestamptz;
    END IF;
END
$$;
-- +goose StatementEnd

-- renew_at: when the worker renews this certificate. NULL for a row it did not write
-- (one uploaded by hand): the worker fills it in from certificate_pem.
-- +goose StatementBegin
DO $$
BEGIN
    IF (SELECT count(*) FROM pg_attribute
        WHERE attrelid = 'proxy_certificates'::regclass AND NOT attisdropped
          AND attname IN ('not_before', 'issuer', 'serial', 'renew_at')) < 4 THEN
        ALTER TABLE proxy_certificates
            ADD COLUMN IF NOT EXISTS not_before timestamptz,
            ADD COLUMN IF NOT EXISTS issuer text,
            ADD COLUMN IF NOT EXISTS serial text,
            ADD COLUMN IF NOT EXISTS renew_at timestamptz;
    END IF;
END
$$;
-- +goose StatementEnd

-- The claim reads only the claimable set, oldest attempt first. A partial index keeps
-- the claim's cost proportional to the queue, not to the (mostly active) table.
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_claimable_idx
    ON proxy_domains (ssl_last_attempt_at NULLS FIRST)
    WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending';

-- Reclaiming abandoned rows and computing the next lease expiry.
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_provisioning_idx
    ON proxy_domains (ssl_lease_expires_at)
    WHERE ssl_status = 'provisioning';

-- Marking renewals, in renewal order.
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_certificates_renew_idx
    ON proxy_certificates (renew_at)
    WHERE auto_renew;

-- Certificates whose renewal time the worker has yet to work out (uploaded by hand).
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_certificates_renew_unknown_idx
    ON proxy_certificates (id)
    WHERE renew_at IS NULL AND auto_renew;

-- A CA that answered "rateLimited" is paused for every instance: no order goes to it
-- before paused_until. Keyed by the ACME directory URL.
CREATE TABLE IF NOT EXISTS certworker_ca_pauses (
    directory    text PRIMARY KEY,
    paused_until timestamptz NOT NULL,
    reason       text NOT NULL DEFAULT '',
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- The wake-up. A row-level BEFORE trigger whose WHEN clause is the whole filter: it
-- costs nothing for the rows that do not enter the claimable set (no function call,
-- nothing queued), and pg_notify with a fixed channel and payload is delivered once
-- per transaction however many rows call it, so a statement that verifies 1,000
-- domains wakes each listener once.
--
-- Rows coming back from 'provisioning' are left out on purpose: only the worker moves
-- a row out of 'provisioning', and it knows. A failure going back to 'pending' is
-- inside its backoff and is handled by the worker's timer; a reclaim happens inside a
-- pass; a hand-back at shutdown notifies explicitly (queue.Release).
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

-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'proxy_domains'::regclass
                   AND tgname = 'certworker_queued_insert') THEN
        CREATE TRIGGER certworker_queued_insert
            BEFORE INSERT ON proxy_domains
            FOR EACH ROW
            WHEN (NEW.verification_status = 'verified' AND NEW.ssl_provider = 'acme'
                  AND NEW.ssl_status = 'pending')
            EXECUTE FUNCTION certworker_queued();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'proxy_domains'::regclass
                   AND tgname = 'certworker_queued_update') THEN
        CREATE TRIGGER certworker_queued_update
            BEFORE UPDATE ON proxy_domains
            FOR EACH ROW
            WHEN (NEW.verification_status = 'verified' AND NEW.ssl_provider = 'acme'
                  AND NEW.ssl_status = 'pending'
                  AND OLD.ssl_status <> 'provisioning'
                  AND NOT (OLD.verification_status = 'verified' AND OLD.ssl_provider = 'acme'
                           AND OLD.ssl_status = 'pending'))
            EXECUTE FUNCTION certworker_queued();
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP TRIGGER IF EXISTS certworker_queued_update ON proxy_domains;
DROP TRIGGER IF EXISTS certworker_queued_insert ON proxy_domains;
DROP FUNCTION IF EXISTS certworker_queued();
DROP TABLE IF EXISTS certworker_ca_pauses;
DROP INDEX IF EXISTS proxy_certificates_renew_unknown_idx;
DROP INDEX IF EXISTS proxy_certificates_renew_idx;
DROP INDEX IF EXISTS proxy_domains_provisioning_idx;
DROP INDEX IF EXISTS proxy_domains_claimable_idx;
ALTER TABLE proxy_certificates
    DROP COLUMN IF EXISTS renew_at, DROP COLUMN IF EXISTS serial,
    DROP COLUMN IF EXISTS issuer, DROP COLUMN IF EXISTS not_before;
ALTER TABLE proxy_domains
    DROP COLUMN IF EXISTS ssl_queued_at, DROP COLUMN IF EXISTS ssl_lease_expires_at,
    DROP COLUMN IF EXISTS ssl_claimed_by, DROP COLUMN IF EXISTS ssl_claim_token;
