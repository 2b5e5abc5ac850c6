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
