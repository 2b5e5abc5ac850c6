-- certworker_orders: the ACME order in flight for a domain, recorded so that whoever
-- takes the domain next goes on with it rather than ordering again (docs/cas.md,
-- "Renewals keep their exemption"). A renewal's order names the certificate it
-- replaces; a CA that already holds a replacement order refuses a second one, and an
-- order sent again without the name would lose the renewal's exemption from the CA's
-- limits.
--
-- The row is written under the order's claim (claim_token, as the HTTP-01 tokens
-- are): the order's URL right after the CA accepted it, the certificate key (sealed
-- as every stored key) just before the finalize. It is deleted with the statement
-- that stores the certificate, or when the CA says the order is over (invalid,
-- expired, gone). replaces_refused is the certificate id a CA refused to see replaced
-- (alreadyReplaced) with no order of ours to resume; rows of deleted domains are
-- pruned by the worker.
--
-- No foreign key to proxy_domains: a write of certworker's must never wait on the
-- proxy's row locks.
--
-- Online: a new table of certworker's own.

-- +goose Up
CREATE TABLE IF NOT EXISTS certworker_orders (
    domain_id        uuid PRIMARY KEY,
    directory        text NOT NULL,
    order_url        text,
    replaces         text,
    key_pem          text,
    replaces_refused text,
    claim_token      uuid,
    recorded_at      timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE IF EXISTS certworker_orders;
