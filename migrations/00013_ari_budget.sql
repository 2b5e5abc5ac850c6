-- The fleet's budget of ACME Renewal Information requests (issue 18). Every instance
-- asks the CA about every stored certificate at the CA's Retry-After (RFC 9773): a
-- million certificates every six hours is 46 requests a second, and each instance
-- asking at its own pace would multiply that by the fleet's size. The instances share
-- one token bucket per CA directory instead (`--ari-requests-per-second`), kept here
-- and taken from by queue.TakeRenewalInfoTokens, one statement at a time: the row's
-- lock is held for that statement only, never across a request to the CA.
--
-- A new table of certworker's own, no lock on a proxy table: plain CREATE ... IF NOT
-- EXISTS, re-runnable.

-- +goose Up

-- tokens: what is left, as of refilled_at (the database's clock), refilled at the
-- taker's rate up to a second's worth. granted: what the last statement took, for it
-- to read back (RETURNING sees only the new row).
CREATE TABLE IF NOT EXISTS certworker_ari_buckets (
    directory   text PRIMARY KEY,
    tokens      double precision NOT NULL,
    refilled_at timestamptz NOT NULL,
    granted     integer NOT NULL DEFAULT 0
);

-- +goose Down
DROP TABLE IF EXISTS certworker_ari_buckets;
