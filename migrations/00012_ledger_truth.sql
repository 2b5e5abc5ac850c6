-- The ledger stays true (issue 17).
--
-- 1. An order whose end the ledger never heard of (an instance that died mid-order,
--    a settle that could not be written) is recorded as 'unknown' once no order can
--    still be running, instead of staying 'pending' for ever. It counts as the CA may
--    have counted it: as an order and as a certificate. Its true outcome, if it comes
--    late, replaces it.
-- 2. Which names each CA has issued a certificate for, through this fleet. Let's
--    Encrypt exempts a renewal from its new-order and per-registered-domain limits,
--    and an order is a renewal there when it has issued the same names before (or
--    the order names a certificate of its own in "replaces"). A certificate stored
--    by someone else (a domain switched from manual to acme with the tenant's upload
--    still there) proves nothing of the kind, and its first ACME order counts as a
--    new one.
--
-- Online: only certworker's own tables are changed; the proxy's are read. The index
-- is built CONCURRENTLY, so NO TRANSACTION, and every statement can run twice.

-- +goose NO TRANSACTION
-- +goose Up

-- The new value set of outcome. certworker_ledger is certworker's own and small (a
-- week of orders): the constraint is swapped in one transaction, and validated in it.
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = 'certworker_ledger'::regclass AND conname = 'certworker_ledger_outcome_check'
                     AND pg_get_constraintdef(oid) LIKE '%unknown%') THEN
        ALTER TABLE certworker_ledger DROP CONSTRAINT IF EXISTS certworker_ledger_outcome_check;
        ALTER TABLE certworker_ledger ADD CONSTRAINT certworker_ledger_outcome_check
            CHECK (outcome IN ('pending', 'issued', 'failed', 'failed_authz', 'not_sent', 'unknown'));
    END IF;
END
$$;
-- +goose StatementEnd

-- The orders still pending, for the maintenance that finds those that outlived any
-- order (queue.SettleStaleLedger) without reading the week's rows on every run.
CREATE INDEX CONCURRENTLY IF NOT EXISTS certworker_ledger_pending_idx
    ON certworker_ledger (directory, at) WHERE outcome = 'pending';

-- directory: the CA's ACME directory URL; name: in lower case (queue.CheckName's).
CREATE TABLE IF NOT EXISTS certworker_issued_names (
    directory text NOT NULL,
    name      text NOT NULL,
    issued_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (directory, name)
);

-- What was known before this migration: the certificates the ledger saw issued, and,
-- where the fleet has ever had one CA only, every certificate stored for a domain
-- that is acme now (the worker counted each as a renewal until now, and a domain
-- that has been acme all along got its certificate from that CA). A manual domain's
-- certificate is left out: it is the case this table exists for.
INSERT INTO certworker_issued_names (directory, name, issued_at)
SELECT directory, name, max(at) FROM certworker_ledger WHERE outcome = 'issued'
GROUP BY directory, name
ON CONFLICT DO NOTHING;

INSERT INTO certworker_issued_names (directory, name, issued_at)
SELECT a.directory, lower(c.domain), COALESCE(c.not_before, c.updated_at)
FROM proxy_certificates c
JOIN proxy_domains d ON d.domain = c.domain AND d.ssl_provider = 'acme'
CROSS JOIN (SELECT min(directory) AS directory FROM certworker_acme_accounts
            HAVING count(DISTINCT directory) = 1) a
ON CONFLICT DO NOTHING;

-- +goose Down
DROP TABLE IF EXISTS certworker_issued_names;
DROP INDEX CONCURRENTLY IF EXISTS certworker_ledger_pending_idx;
-- +goose StatementBegin
DO $$
BEGIN
    UPDATE certworker_ledger SET outcome = 'issued' WHERE outcome = 'unknown';
    ALTER TABLE certworker_ledger DROP CONSTRAINT IF EXISTS certworker_ledger_outcome_check;
    ALTER TABLE certworker_ledger ADD CONSTRAINT certworker_ledger_outcome_check
        CHECK (outcome IN ('pending', 'issued', 'failed', 'failed_authz', 'not_sent'));
END
$$;
-- +goose StatementEnd
