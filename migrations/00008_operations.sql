-- What operating certworker needs (issue #12): the HTTP-01 responder's in-memory token
-- set is kept fresh by a notification, and the fleet's alert metrics (queue.FleetStats)
-- read the domain table through an index instead of the table.
--
-- Online, like 00005: NO TRANSACTION, every statement can run twice, the trigger is
-- replaced inside one DO block, and the index is built CONCURRENTLY (the proxy keeps
-- writing proxy_domains meanwhile).

-- +goose NO TRANSACTION
-- +goose Up

-- Every responder holds the pending HTTP-01 tokens in memory, so that a request for a
-- token that is not pending (most of what reaches port 80 from the internet) costs
-- the database nothing. A row that is inserted, changed or deleted notifies
-- certworker_http01 with its token; each responder reads that one row again (or
-- forgets the token when the row is gone). Whoever writes the row, an order's
-- Present, its CleanUp, the preflight's probe, an operator, every responder hears of
-- it: nobody has to remember to notify.
--
-- NOTIFY here is cheap: only certworker writes this table, a few rows per order, and
-- never in the proxy's transactions (which is why the wake trigger can be switched to
-- logical replication and this one need not be). A token is at most 256 characters
-- (acme.isToken), far inside NOTIFY's 8,000-byte payload.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION certworker_http01_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('certworker_http01', OLD.token);
    ELSE
        PERFORM pg_notify('certworker_http01', NEW.token);
        IF TG_OP = 'UPDATE' AND OLD.token <> NEW.token THEN
            PERFORM pg_notify('certworker_http01', OLD.token);
        END IF;
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
BEGIN
    DROP TRIGGER IF EXISTS certworker_http01_changed ON certworker_http01_tokens;
    CREATE TRIGGER certworker_http01_changed
        AFTER INSERT OR UPDATE OR DELETE ON certworker_http01_tokens
        FOR EACH ROW EXECUTE FUNCTION certworker_http01_changed();
END
$$;
-- +goose StatementEnd

-- The fleet statistics (queue.FleetStats): counts by ssl_status, the verified share
-- holding a valid certificate, the next expiry, and the failed or retrying rows close
-- to expiry. With every column they read in the index, the counts are one index-only
-- scan of the acme rows instead of a read of the whole table, whose rows are wide; and
-- the rows close to expiry are a range scan of it. The expiry comes first on purpose:
-- an index led by the status would also serve the claim's "pending and verified", and
-- the planner took it over the queue's own index (which gives the claim its order).
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_fleet_idx
    ON proxy_domains (ssl_expires_at, ssl_status, verification_status)
    WHERE ssl_provider = 'acme';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS proxy_domains_fleet_idx;
DROP TRIGGER IF EXISTS certworker_http01_changed ON certworker_http01_tokens;
DROP FUNCTION IF EXISTS certworker_http01_changed();
