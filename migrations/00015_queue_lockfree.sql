-- The queue without a lock of ours in the proxy's transactions, and a claim that reads
-- only what it can take; tenants taking turns among urgent renewals (docs/internals.md,
-- "Order of service").
--
-- Until now the wake trigger drew a row's place from its tenant's counter
-- (certworker_enqueue upserted certworker_tenants), inside the proxy's transaction:
-- that row lock lasted until the proxy committed, two proxy transactions verifying
-- tenants A then B and B then A deadlocked (40P01), and our reclaim, requeue and
-- failure writes waited behind any open verify of the same tenant. The trigger now
-- only reads: a row's place is one past its tenant's last place in its tier, and no
-- earlier than the tier's clock, the smallest place among the tier's rows in line,
-- both read from indexes. Reads take no lock. Two verifies of one tenant that run at
-- once may give two rows the same place: harmless, the tenant gets two rows in that
-- round. No claim writes a clock either (certworker_queue_clock was one hot row that
-- every claim updated), and each tier has its own clock, so an urgent renewal of a
-- tenant with a backlog no longer moves first issuances' clock.
--
-- ssl_held takes a row out of line: the claim's index (proxy_domains_line_idx) holds
-- only rows in line, so rows in backoff or under a pause cost the claim nothing.
--   NULL                      in line;
--   'backoff'                 its backoff (--retry-base * 2^attempts, capped) had not run out;
--   'registered_domain:KEY',
--   'domain:KEY'              held under that pause.
-- The worker's failure write puts a row out of line; the claim takes out, under SKIP
-- LOCKED, rows in line it finds held back (a pause that started, a longer
-- --retry-base, a hand edit); and before each claim the worker brings back in line
-- every row whose backoff by the current formula, from its own ssl_attempts, has run
-- out and whose pause has ended, under SKIP LOCKED. So the formula stays the one
-- rule, and a hand edit or a changed --retry-base takes effect at the next pass. No
-- pause ever updates a proxy row. A row entering the queue from outside comes in in
-- line, whatever the column said when it left.
--
-- Online, as 00005: NO TRANSACTION, every statement can run twice, the column is
-- nullable without a default (a catalogue change), ALTER TABLE runs only when it is
-- missing, indexes are built CONCURRENTLY (a build that gave up leaves an INVALID
-- index, which the runner drops before it retries), the trigger's function is
-- replaced in place (its trigger picks it up at its next call) and every lock on a
-- proxy table is taken under migrate's --lock-timeout.

-- +goose NO TRANSACTION
-- +goose Up

-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'proxy_domains'::regclass AND NOT attisdropped
                     AND attname = 'ssl_held') THEN
        ALTER TABLE proxy_domains ADD COLUMN IF NOT EXISTS ssl_held text;
    END IF;
END
$$;
-- +goose StatementEnd

-- The claim's order of service over the rows in line: tier, place, the row queued
-- last first (00005's proxy_domains_queue_idx, which it replaces, less the rows held
-- out). The first entry of a tier is also that tier's clock.
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_line_idx
    ON proxy_domains ((COALESCE(ssl_queue_tier, 2)), (COALESCE(ssl_queue_seq, 0)), ssl_queued_at DESC NULLS LAST)
    WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending'
      AND ssl_held IS NULL;

-- A tenant's last place in a tier (the wake trigger), and a tenant's urgent renewals by
-- expiry (the claim's turns in tier 1).
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_tenant_line_idx
    ON proxy_domains (tenant_id, (COALESCE(ssl_queue_tier, 2)), (COALESCE(ssl_queue_seq, 0)))
    WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending'
      AND ssl_held IS NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_urgent_idx
    ON proxy_domains (tenant_id, ssl_renew_by)
    WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending'
      AND ssl_held IS NULL AND ssl_queue_tier = 1;

-- Rows held out: per attempt count, the oldest attempt first (the backoff that runs
-- out first), and the pauses rows wait for.
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_held_backoff_idx
    ON proxy_domains (ssl_attempts, ssl_last_attempt_at NULLS FIRST)
    WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending'
      AND ssl_held = 'backoff';
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_held_pause_idx
    ON proxy_domains (ssl_held)
    WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending'
      AND ssl_held <> 'backoff';

-- The wake trigger's function (00005, 00009), reading only. For a row entering the
-- claimable set: stamp ssl_queued_at; its tier; its place, unless it is handed back
-- (leaving 'provisioning' with its attempts unchanged: it keeps its place at the
-- front); in line, unless the write itself took it out (the worker's failure write);
-- notify, unless the write is the worker's own failure write (certworker.quiet).
-- Tier 1 rows get a place too: tenants take turns there (the claim serves each turn
-- with the tenant's earliest expiry).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION public.certworker_queued() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    NEW.ssl_queued_at := pg_catalog.clock_timestamp();
    NEW.ssl_queue_tier := CASE WHEN NEW.ssl_renew_by IS NULL THEN 2
                               WHEN NEW.ssl_renew_by <= pg_catalog.now() THEN 1
                               ELSE 3 END;
    IF TG_OP = 'INSERT' OR NEW.ssl_held IS NOT DISTINCT FROM OLD.ssl_held THEN
        NEW.ssl_held := NULL;
    END IF;
    IF NOT (TG_OP = 'UPDATE' AND OLD.ssl_status = 'provisioning'
            AND NEW.ssl_attempts IS NOT DISTINCT FROM OLD.ssl_attempts
            AND NEW.ssl_queue_seq IS NOT NULL) THEN
        NEW.ssl_queue_seq := GREATEST(
            COALESCE((SELECT COALESCE(d.ssl_queue_seq, 0) FROM public.proxy_domains d
                      WHERE d.verification_status = 'verified' AND d.ssl_provider = 'acme'
                        AND d.ssl_status = 'pending' AND d.ssl_held IS NULL
                        AND COALESCE(d.ssl_queue_tier, 2) = NEW.ssl_queue_tier
                      ORDER BY COALESCE(d.ssl_queue_tier, 2), COALESCE(d.ssl_queue_seq, 0)
                      LIMIT 1), 0),
            COALESCE((SELECT COALESCE(d.ssl_queue_seq, 0) + 1 FROM public.proxy_domains d
                      WHERE d.verification_status = 'verified' AND d.ssl_provider = 'acme'
                        AND d.ssl_status = 'pending' AND d.ssl_held IS NULL
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
-- +goose StatementEnd
REVOKE ALL ON FUNCTION public.certworker_queued() FROM PUBLIC;

-- Superseded by proxy_domains_line_idx.
DROP INDEX CONCURRENTLY IF EXISTS proxy_domains_queue_idx;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_queue_idx
    ON proxy_domains ((COALESCE(ssl_queue_tier, 2)), (COALESCE(ssl_queue_seq, 0)), ssl_queued_at DESC NULLS LAST)
    WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending';
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
DROP INDEX CONCURRENTLY IF EXISTS proxy_domains_held_pause_idx;
DROP INDEX CONCURRENTLY IF EXISTS proxy_domains_held_backoff_idx;
DROP INDEX CONCURRENTLY IF EXISTS proxy_domains_urgent_idx;
DROP INDEX CONCURRENTLY IF EXISTS proxy_domains_tenant_line_idx;
DROP INDEX CONCURRENTLY IF EXISTS proxy_domains_line_idx;
ALTER TABLE proxy_domains DROP COLUMN IF EXISTS ssl_held;
