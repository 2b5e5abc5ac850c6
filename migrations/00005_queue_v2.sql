-- The queue as issues #8, #9 and #13 need it: hand-backs that restore the attempt
-- time, a fair order of service between tenants, pauses scoped to what a CA's limit
-- covers, the limit ledger, the fleet's settings, and a wake trigger that follows
-- the wake rule (every move into the claimable set notifies, but the worker's own
-- failure write).
--
-- Online: no statement here holds a lock on a proxy table for longer than it takes to
-- change its catalogue entry (every run is under --lock-timeout and retried), indexes
-- are built CONCURRENTLY, and every statement can run twice, so that a migration
-- interrupted half-way is finished by the next run. Hence NO TRANSACTION, and DO
-- blocks where two statements must take effect together.

-- +goose NO TRANSACTION
-- +goose Up

-- ssl_claim_prev_attempt_at: ssl_last_attempt_at as it was before the claim stamped
-- it. A hand-back (shutdown, a rate limit, a claim that was never started) puts it
-- back, so that handing back costs the domain no backoff. Kept in the row rather than
-- in the instance's memory because a claim whose result was lost in transit (the
-- statement committed, the answer did not arrive) must be handed back too.
--
-- ssl_queue_seq and ssl_queue_tier: the row's place in the order of service
-- (docs/internals.md, "Order of service"). The tier is 1 for a renewal that is urgent, 2 for a
-- first issuance or its retries, 3 for a renewal with time to spare; within a tier the
-- row with the lower seq is served first. The seq is drawn from the tenant's own
-- counter when the row enters the queue (certworker_enqueue), which is never behind
-- the position the queue is serving, so a tenant with 2,000 rows queued gets one turn
-- in each round, not every turn, and a tenant that queues one row later is served in
-- the next round.
--
-- ssl_renew_by: for a row holding a certificate, when its renewal becomes urgent:
-- a fifth of the lifetime before expiry, or the end of the CA's renewal window if that
-- comes first. NULL for a row without one (its first issuance).
--
-- ALTER TABLE takes an ACCESS EXCLUSIVE lock even when every column exists already,
-- so it runs only when one is missing (as in 00002): a run that is retried, or a second
-- one, does not queue the proxy's writes behind it again.
-- +goose StatementBegin
DO $$
BEGIN
    IF (SELECT count(*) FROM pg_attribute
        WHERE attrelid = 'proxy_domains'::regclass AND NOT attisdropped
          AND attname IN ('ssl_claim_prev_attempt_at', 'ssl_queue_seq', 'ssl_queue_tier', 'ssl_renew_by')) < 4 THEN
        ALTER TABLE proxy_domains
            ADD COLUMN IF NOT EXISTS ssl_claim_prev_attempt_at timestamptz,
            ADD COLUMN IF NOT EXISTS ssl_queue_seq bigint,
            ADD COLUMN IF NOT EXISTS ssl_queue_tier smallint,
            ADD COLUMN IF NOT EXISTS ssl_renew_by timestamptz;
    END IF;
END
$$;
-- +goose StatementEnd

-- The CA's renewal information for a stored certificate: the end of its suggested
-- window (past it a renewal is urgent) and when to ask again.
-- +goose StatementBegin
DO $$
BEGIN
    IF (SELECT count(*) FROM pg_attribute
        WHERE attrelid = 'proxy_certificates'::regclass AND NOT attisdropped
          AND attname IN ('ari_window_end', 'ari_next_at')) < 2 THEN
        ALTER TABLE proxy_certificates
            ADD COLUMN IF NOT EXISTS ari_window_end timestamptz,
            ADD COLUMN IF NOT EXISTS ari_next_at timestamptz;
    END IF;
END
$$;
-- +goose StatementEnd

-- The fleet's settings, recorded by every `certworker run` at start so that `status`
-- computes next attempts under the curve the workers use, and so that the limit
-- ledger is the same for every instance. NULL until a worker has recorded them.
ALTER TABLE certworker_settings
    ADD COLUMN IF NOT EXISTS retry_base_seconds double precision,
    ADD COLUMN IF NOT EXISTS retry_max_seconds double precision,
    ADD COLUMN IF NOT EXISTS max_attempts integer,
    ADD COLUMN IF NOT EXISTS limits jsonb;

-- Each tenant's counter for ssl_queue_seq. No foreign key: a tenant deleted by the
-- proxy must not wait on this table, and its row is pruned.
CREATE TABLE IF NOT EXISTS certworker_tenants (
    tenant_id uuid PRIMARY KEY,
    vtime     bigint NOT NULL DEFAULT 0
);

-- The position the queue is serving: the highest ssl_queue_seq claimed so far. A row
-- entering the queue is never placed before it, so that an idle tenant's old counter
-- does not put its new rows ahead of everyone's.
CREATE TABLE IF NOT EXISTS certworker_queue_clock (
    id    boolean PRIMARY KEY DEFAULT true CHECK (id),
    vtime bigint NOT NULL DEFAULT 0
);
INSERT INTO certworker_queue_clock (id, vtime) VALUES (true, 0) ON CONFLICT (id) DO NOTHING;

-- Pauses: what must not be ordered before paused_until. Every instance's claim reads
-- them; the scope is what a CA's limit covers (docs/cas.md, "Pauses"):
--   'ca'                 key: the ACME directory URL; nothing is ordered from it;
--   'registered_domain'  key: a registered domain (public suffix list); no name under
--                        it is ordered;
--   'domain'             key: a domain name in lower case.
-- source says who paused: the CA's rate limit ('rate_limit'), the worker's own ledger
-- ('ledger'), or a CA that could not be reached ('unreachable', with failures counting
-- the consecutive ones for its backoff). A pause is never charged to a domain.
CREATE TABLE IF NOT EXISTS certworker_pauses (
    scope        text NOT NULL CHECK (scope IN ('ca', 'registered_domain', 'domain')),
    key          text NOT NULL,
    source       text NOT NULL CHECK (source IN ('rate_limit', 'ledger', 'unreachable')),
    paused_until timestamptz NOT NULL,
    reason       text NOT NULL DEFAULT '',
    failures     integer NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key, source)
);
CREATE INDEX IF NOT EXISTS certworker_pauses_until_idx ON certworker_pauses (paused_until);

-- Superseded by certworker_pauses; a pause is transient, so nothing is carried over.
DROP TABLE IF EXISTS certworker_ca_pauses;

-- The limit ledger: every order this fleet placed, so that the worker does not send
-- an order the CA's published limits would refuse (docs/cas.md, "The limit ledger"). One row
-- per order, written under a lock in the transaction that decides the order may go,
-- so two instances never exceed a limit together; its outcome is updated when the
-- order ends. Rows older than the longest window are pruned.
CREATE TABLE IF NOT EXISTS certworker_ledger (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at                timestamptz NOT NULL DEFAULT now(),
    directory         text NOT NULL,
    domain_id         uuid,
    name              text NOT NULL,
    registered_domain text NOT NULL,
    renewal           boolean NOT NULL DEFAULT false,
    claim_token       uuid,
    outcome           text NOT NULL DEFAULT 'pending'
        CHECK (outcome IN ('pending', 'issued', 'failed', 'failed_authz', 'not_sent'))
);
CREATE INDEX IF NOT EXISTS certworker_ledger_at_idx ON certworker_ledger (directory, at);
CREATE INDEX IF NOT EXISTS certworker_ledger_registered_domain_idx ON certworker_ledger (registered_domain, at);
CREATE INDEX IF NOT EXISTS certworker_ledger_name_idx ON certworker_ledger (name, at);
CREATE INDEX IF NOT EXISTS certworker_ledger_claim_idx ON certworker_ledger (claim_token) WHERE claim_token IS NOT NULL;

-- A row's place in its tenant's line (see ssl_queue_seq above): one past the tenant's
-- last, and never before the position the queue is serving. SECURITY DEFINER because
-- the wake trigger calls it with the privileges of whoever writes proxy_domains (the
-- proxy's role), which need not have any right on certworker_tenants.
-- +goose StatementBegin
-- Created and revoked from PUBLIC in one DO block (NO TRANSACTION runs each statement
-- on its own): a definer function is never executable by PUBLIC, not even between two
-- statements of a fresh install.
DO $do$
BEGIN
CREATE OR REPLACE FUNCTION certworker_enqueue(p_tenant uuid) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    INSERT INTO certworker_tenants AS t (tenant_id, vtime)
    VALUES (p_tenant, COALESCE((SELECT vtime FROM certworker_queue_clock WHERE id), 0) + 1)
    ON CONFLICT (tenant_id) DO UPDATE
        SET vtime = GREATEST(t.vtime, COALESCE((SELECT vtime FROM certworker_queue_clock WHERE id), 0)) + 1
    RETURNING vtime
$$;
REVOKE ALL ON FUNCTION certworker_enqueue(uuid) FROM PUBLIC;
END
$do$;
-- +goose StatementEnd

-- Every suffix of a name with at least two labels, the name first: the keys under
-- which a pause of its registered domain can be stored, whatever the public suffix
-- list makes of it (the worker computes the registered domain; the claim only needs
-- to find it among these).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION certworker_suffixes(p_name text) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT COALESCE(array_agg(array_to_string(l[i:], '.') ORDER BY i), '{}')
    FROM (SELECT string_to_array(lower(p_name), '.') AS l) s,
         generate_series(1, GREATEST(cardinality(l) - 1, 0)) AS i
$$;
-- +goose StatementEnd

-- The wake trigger's function (migrations 00002 and 00004). For a row entering the
-- claimable set it stamps ssl_queued_at, gives the row its place in the order of
-- service, and notifies (in notify mode), unless the write is the worker's own
-- failure write: that one is inside its backoff, and the worker's timer covers it.
-- The worker marks such a write by setting certworker.quiet in its transaction. A
-- row handed back (leaving 'provisioning' with its attempts unchanged) keeps its
-- place: it was at the front, and a hand-back costs it nothing.
-- +goose StatementBegin
-- Created and revoked from PUBLIC in one DO block (NO TRANSACTION runs each statement
-- on its own): a definer function is never executable by PUBLIC, not even between two
-- statements of a fresh install.
DO $do$
BEGIN
CREATE OR REPLACE FUNCTION certworker_queued() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    NEW.ssl_queued_at := clock_timestamp();
    IF NOT (TG_OP = 'UPDATE' AND OLD.ssl_status = 'provisioning'
            AND NEW.ssl_attempts IS NOT DISTINCT FROM OLD.ssl_attempts
            AND NEW.ssl_queue_seq IS NOT NULL) THEN
        NEW.ssl_queue_seq := certworker_enqueue(NEW.tenant_id);
    END IF;
    NEW.ssl_queue_tier := CASE WHEN NEW.ssl_renew_by IS NULL THEN 2
                               WHEN NEW.ssl_renew_by <= now() THEN 1
                               ELSE 3 END;
    IF COALESCE(current_setting('certworker.quiet', true), '') <> 'on'
       AND COALESCE((SELECT wake FROM certworker_settings WHERE id), 'notify') = 'notify' THEN
        PERFORM pg_notify('certworker_wake', '');
    END IF;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION certworker_queued() FROM PUBLIC;
END
$do$;
-- +goose StatementEnd

-- The wake rule: an update that moves a row into the claimable set from outside it
-- fires, whoever makes it, moves out of 'provisioning' included (the proxy's and an
-- operator's edits, a hand-back); the function above keeps the worker's failure write
-- silent. One transaction, so that no write goes unseen between the drop and the
-- create; and only while the trigger is still 00002's (its WHEN clause leaves out rows
-- coming from 'provisioning'), so that a second run takes no lock on the table.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_trigger
               WHERE tgrelid = 'proxy_domains'::regclass AND tgname = 'certworker_queued_update'
                 AND pg_get_triggerdef(oid) NOT LIKE '%''provisioning''%') THEN
        RETURN;
    END IF;
    DROP TRIGGER IF EXISTS certworker_queued_update ON proxy_domains;
    CREATE TRIGGER certworker_queued_update
        BEFORE UPDATE ON proxy_domains
        FOR EACH ROW
        WHEN (NEW.verification_status = 'verified' AND NEW.ssl_provider = 'acme'
              AND NEW.ssl_status = 'pending'
              AND NOT (OLD.verification_status = 'verified' AND OLD.ssl_provider = 'acme'
                       AND OLD.ssl_status = 'pending'))
        EXECUTE FUNCTION certworker_queued();
END
$$;
-- +goose StatementEnd

-- The claim's order of service: tier, then place, then the row queued last. A row
-- that entered the queue before this migration has neither tier nor place, and counts
-- as a first issuance at the front (it has waited longest). Places tie between
-- tenants (each tenant's first row after the queue's position gets the same one); the
-- row queued last goes first, which puts a tenant that has just arrived ahead of one
-- whose backlog took that place long ago. Built concurrently: the proxy keeps writing
-- meanwhile. A build that gave up leaves an INVALID index that IF NOT EXISTS would
-- skip: the migration runner drops those before it retries.
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_queue_idx
    ON proxy_domains ((COALESCE(ssl_queue_tier, 2)), (COALESCE(ssl_queue_seq, 0)), ssl_queued_at DESC NULLS LAST)
    WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending';

-- The next backoff to run out: per attempt count, the oldest attempt (NextDue reads
-- one entry per count instead of every queued row).
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_backoff_idx
    ON proxy_domains (ssl_attempts, ssl_last_attempt_at NULLS FIRST)
    WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending';

-- Renewals with time to spare whose renewal has become urgent (promoted to tier 1).
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_renew_by_idx
    ON proxy_domains (ssl_renew_by)
    WHERE ssl_queue_tier = 3 AND verification_status = 'verified' AND ssl_provider = 'acme'
      AND ssl_status = 'pending';

-- Names compared without regard to case: the claim skips two rows whose names differ
-- only in case (one name to a CA), and `status` and `retry` look names up this way.
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_lower_domain_idx
    ON proxy_domains (lower(domain));

-- Certificates whose renewal information is due to be fetched again.
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_certificates_ari_idx
    ON proxy_certificates (ari_next_at) WHERE ari_next_at IS NOT NULL;

-- Superseded by the two above.
DROP INDEX CONCURRENTLY IF EXISTS proxy_domains_claimable_idx;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS proxy_certificates_ari_idx;
DROP INDEX CONCURRENTLY IF EXISTS proxy_domains_lower_domain_idx;
DROP INDEX CONCURRENTLY IF EXISTS proxy_domains_renew_by_idx;
DROP INDEX CONCURRENTLY IF EXISTS proxy_domains_backoff_idx;
DROP INDEX CONCURRENTLY IF EXISTS proxy_domains_queue_idx;
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_claimable_idx
    ON proxy_domains (ssl_last_attempt_at NULLS FIRST)
    WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending';
-- +goose StatementBegin
DO $$
BEGIN
    DROP TRIGGER IF EXISTS certworker_queued_update ON proxy_domains;
    CREATE TRIGGER certworker_queued_update
        BEFORE UPDATE ON proxy_domains
        FOR EACH ROW
        WHEN (NEW.verification_status = 'verified' AND NEW.ssl_provider = 'acme'
              AND NEW.ssl_status = 'pending'
              AND OLD.ssl_status <> 'provisioning'
              AND NOT (OLD.verification_status = 'verified' AND OLD.ssl_provider = 'acme'
                       AND OLD.ssl_status = 'pending'))
        EXECUTE FUNCTION certworker_queued();
END
$$;
-- +goose StatementEnd
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
DROP FUNCTION IF EXISTS certworker_suffixes(text);
DROP FUNCTION IF EXISTS certworker_enqueue(uuid);
DROP TABLE IF EXISTS certworker_ledger;
DROP TABLE IF EXISTS certworker_pauses;
CREATE TABLE IF NOT EXISTS certworker_ca_pauses (
    directory    text PRIMARY KEY,
    paused_until timestamptz NOT NULL,
    reason       text NOT NULL DEFAULT '',
    updated_at   timestamptz NOT NULL DEFAULT now()
);
DROP TABLE IF EXISTS certworker_queue_clock;
DROP TABLE IF EXISTS certworker_tenants;
ALTER TABLE certworker_settings
    DROP COLUMN IF EXISTS limits, DROP COLUMN IF EXISTS max_attempts,
    DROP COLUMN IF EXISTS retry_max_seconds, DROP COLUMN IF EXISTS retry_base_seconds;
ALTER TABLE proxy_certificates DROP COLUMN IF EXISTS ari_next_at, DROP COLUMN IF EXISTS ari_window_end;
ALTER TABLE proxy_domains
    DROP COLUMN IF EXISTS ssl_renew_by, DROP COLUMN IF EXISTS ssl_queue_tier,
    DROP COLUMN IF EXISTS ssl_queue_seq, DROP COLUMN IF EXISTS ssl_claim_prev_attempt_at;
