-- The withdrawn event of a domain's history (docs/domain-status.md, "Events").
--
-- proxy_domains.ssl_withdrawn_at: when the row last left verification_status
-- 'verified' with ssl_provider 'acme' (the proxy unverified it or took it to another
-- provider), stamped by the BEFORE trigger certworker_eligible_since in the proxy's
-- own statement, as ssl_eligible_at is. The worker's maintenance records the
-- withdrawn event at that time, in the statement that clears the stamp
-- (queue.Queue.RecordWithdrawals), so nothing is written to certworker's tables inside
-- the proxy's transaction. A partial index finds the stamped rows.
--
-- Online, as 00019: NO TRANSACTION, every statement can run twice, the column is
-- nullable without a default (a catalogue change), ALTER TABLE on the proxy's table
-- runs only when the column is missing, the index is built CONCURRENTLY (a build that
-- gave up leaves an INVALID index, which the runner drops before it retries), and
-- every lock is taken under migrate's --lock-timeout.

-- +goose NO TRANSACTION
-- +goose Up
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'proxy_domains'::regclass AND NOT attisdropped
                     AND attname = 'ssl_withdrawn_at') THEN
        ALTER TABLE proxy_domains ADD COLUMN IF NOT EXISTS ssl_withdrawn_at timestamptz;
    END IF;
END
$$;
-- +goose StatementEnd

CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_withdrawn_idx
    ON proxy_domains (ssl_withdrawn_at) WHERE ssl_withdrawn_at IS NOT NULL;

-- +goose Down
DROP INDEX IF EXISTS proxy_domains_withdrawn_idx;
ALTER TABLE proxy_domains DROP COLUMN IF EXISTS ssl_withdrawn_at;
