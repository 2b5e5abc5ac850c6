-- A fleet with a second CA holds out of line the rows a hold of the first CA keeps
-- back, as the one-CA claim does with its pauses (docs/cas.md, "A second CA"), and
-- measures that hold from when the row's wait began, not from its last hand-back.
--
-- ssl_held 'routed': held back at the CA the row would go to for now (a hold of the
-- first CA younger than --acme-fallback-after, or a pause of the second), until
-- ssl_held_until, the first moment the decision can change: the hold's pause ending
-- or the hold reaching --acme-fallback-after. ReturnHeld brings such a row back in
-- line then, and NextDue sets the worker's timer for it. ssl_held_until means nothing
-- for any other value of ssl_held.
--
-- ssl_waiting_since: when the row's current wait for a certificate began. The wake
-- trigger sets it when the row enters the queue, and keeps it when the row is handed
-- back uncharged (a hand-back keeps its place too). ssl_queued_at is stamped again on
-- every entry, hand-backs included: a row handed back at each end of a doubling
-- outage pause of the first CA was measured from its last hand-back, and went to the
-- second CA long after --acme-fallback-after.
--
-- proxy_domains_due_line_idx takes the place of proxy_domains_due_idx in NextDue: only
-- rows in line or in backoff fall due by backoff. A row held under a pause falls due when the
-- pause ends, a 'routed' row at ssl_held_until, a row waiting for its DNS when its
-- check says so; in the old index a routed row, ready by backoff, made NextDue say
-- "due now" for as long as it was held. The old index stays: it holds pending rows
-- only, and dropping it would make 00021, run again, build it CONCURRENTLY, which waits
-- for every open transaction of the proxy's.
--
-- Online, as 00015: NO TRANSACTION, every statement can run twice, the columns are
-- nullable without a default (a catalogue change), ALTER TABLE runs only when a column
-- is missing, indexes are built CONCURRENTLY.

-- +goose NO TRANSACTION
-- +goose Up

-- +goose StatementBegin
DO $$
BEGIN
    IF (SELECT count(*) FROM pg_attribute
        WHERE attrelid = 'proxy_domains'::regclass AND NOT attisdropped
          AND attname IN ('ssl_held_until', 'ssl_waiting_since')) < 2 THEN
        ALTER TABLE proxy_domains
            ADD COLUMN IF NOT EXISTS ssl_held_until timestamptz,
            ADD COLUMN IF NOT EXISTS ssl_waiting_since timestamptz;
    END IF;
END
$$;
-- +goose StatementEnd

CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_routed_idx
    ON proxy_domains (ssl_held_until)
    WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending'
      AND ssl_held = 'routed';

CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_due_line_idx
    ON proxy_domains (ssl_attempts, ssl_last_attempt_at NULLS FIRST)
    WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending'
      AND (ssl_held IS NULL OR ssl_held = 'backoff');


-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS proxy_domains_due_line_idx;
DROP INDEX CONCURRENTLY IF EXISTS proxy_domains_routed_idx;
ALTER TABLE proxy_domains DROP COLUMN IF EXISTS ssl_waiting_since, DROP COLUMN IF EXISTS ssl_held_until;
