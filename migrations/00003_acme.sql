-- What the ACME issuer (package acme) keeps in PostgreSQL: the account it orders with,
-- shared by every instance, and the HTTP-01 tokens of the orders in flight, so that
-- whichever instance the CA's validation request reaches can answer it.

-- +goose Up

-- One ACME account per directory and external account binding. Every instance and
-- every restart reuses it: an account per instance would multiply the CA's
-- per-account rate limits and leave orphaned accounts behind at each deploy.
--
-- The first instance that needs an account registers it while holding
-- pg_advisory_xact_lock on the (directory, eab_kid) pair and inserts it in the same
-- transaction; a second instance starting at the same moment waits on the lock and
-- then finds the row. The primary key is the backstop.
CREATE TABLE IF NOT EXISTS certworker_acme_accounts (
    directory       text NOT NULL,
    -- The external account binding's key id, '' when the CA needs none.
    eab_kid         text NOT NULL DEFAULT '',
    -- The contact the account was registered with, '' for none.
    email           text NOT NULL DEFAULT '',
    -- The account's private key: PEM, or the sealed form (README, acme/doc.go)
    -- bound to the directory URL when the worker runs with --key-encryption-key.
    private_key_pem text NOT NULL,
    -- The account URL the CA returned (the JWS "kid").
    uri             text NOT NULL,
    -- The CA's account object as registered (lego's registration.Resource).
    registration    jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (directory, eab_kid)
);

-- The HTTP-01 challenges of orders in flight on any instance. The order's instance
-- writes the row (and commits) before it asks the CA to validate, and deletes it when
-- the challenge is done. expires_at bounds the life of a row an instance left behind
-- when it died mid-order: the responder ignores expired rows, and every new challenge
-- deletes them.
CREATE TABLE IF NOT EXISTS certworker_http01_tokens (
    token             text PRIMARY KEY,
    key_authorization text NOT NULL,
    domain            text NOT NULL,
    expires_at        timestamptz NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS certworker_http01_tokens_expires_idx
    ON certworker_http01_tokens (expires_at);

-- +goose Down
DROP TABLE IF EXISTS certworker_http01_tokens;
DROP TABLE IF EXISTS certworker_acme_accounts;
