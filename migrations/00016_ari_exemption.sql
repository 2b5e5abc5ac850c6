-- The ledger follows the CA's exemptions (issue #18). Let's Encrypt exempts a renewal
-- from all its limits when the order names the certificate it replaces ("replaces",
-- RFC 9773) while the CA's time is inside the renewal window it suggested for that
-- certificate; any other renewal of the same name only from new orders per account
-- and certificates per registered domain. To tell the two apart the worker needs the
-- start of the window it last read, beside its end (00005), and the ledger records
-- which of its orders were exempt so, so that its counts stay true.
--
-- Online, as 00014: NO TRANSACTION, every statement can run twice, the columns are
-- added without a rewrite (nullable; a constant default on certworker's own table),
-- ALTER TABLE on the proxy's table runs only when the column is missing, under
-- migrate's --lock-timeout.

-- +goose NO TRANSACTION
-- +goose Up

-- ari_window_start: the start of the CA's suggested renewal window, as last read
-- (with ari_window_end), written by the worker. NULL where none was read, and for a
-- certificate someone else wrote (the trigger below clears it).
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'proxy_certificates'::regclass AND NOT attisdropped
                     AND attname = 'ari_window_start') THEN
        ALTER TABLE proxy_certificates ADD COLUMN IF NOT EXISTS ari_window_start timestamptz;
    END IF;
END
$$;
-- +goose StatementEnd

-- 00014's, which also forgets the window's start.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION certworker_certificate_replaced() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.renew_at := NULL;
    NEW.not_before := NULL;
    NEW.issuer := NULL;
    NEW.serial := NULL;
    NEW.ari_window_start := NULL;
    NEW.ari_window_end := NULL;
    NEW.ari_next_at := NULL;
    NEW.profile := NULL;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- exempt: the order named the certificate it replaces inside that certificate's
-- window, and was held back by no limit (queue.Admit). It still counts, as an issued
-- certificate of its name, against later orders that are not exempt.
-- Only when missing: ALTER TABLE takes an exclusive lock even when there is nothing to
-- add, and the workers write the ledger before every order.
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'certworker_ledger'::regclass AND NOT attisdropped
                     AND attname = 'exempt') THEN
        ALTER TABLE certworker_ledger ADD COLUMN IF NOT EXISTS exempt boolean NOT NULL DEFAULT false;
    END IF;
END
$$;
-- +goose StatementEnd

-- The certificates whose renewal window has started: what `status` and the metric
-- certworker_certificates_replace_now count (queue.ReplaceProgress). A range scan of
-- it reads only those, a handful while the fleet is healthy.
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_certificates_ari_window_idx
    ON proxy_certificates (ari_window_start) WHERE ari_window_start IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS proxy_certificates_ari_window_idx;
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION certworker_certificate_replaced() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.renew_at := NULL;
    NEW.not_before := NULL;
    NEW.issuer := NULL;
    NEW.serial := NULL;
    NEW.ari_window_end := NULL;
    NEW.ari_next_at := NULL;
    NEW.profile := NULL;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
ALTER TABLE certworker_ledger DROP COLUMN IF EXISTS exempt;
-- proxy_certificates.ari_window_start stays: the proxy may read it, and dropping a
-- column takes an exclusive lock on its table.
