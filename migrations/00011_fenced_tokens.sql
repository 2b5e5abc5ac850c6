-- HTTP-01 token writes fenced by the claim (issue #17): each token row records the
-- claim (proxy_domains.ssl_claim_token) of the order that wrote it. An order writes
-- its token only while its claim is held, and deletes only a row its own claim
-- wrote, so that the order of an instance that was cut off or paused past its lease
-- cannot delete or overwrite the token of the order that reclaimed the domain: a CA
-- that reuses a pending authorization gives both orders the same token
-- (acme/http01.go, tokenStore).
--
-- NULL for a row written outside the worker (a preflight probe, a tool) or by a
-- binary older than this migration; those are deleted by token as before. No
-- foreign key: the row must not wait on proxy_domains, and it expires by itself.
--
-- Online: the table is certworker's own, and adding a nullable column without a
-- default changes only the catalogue. The catalogue check keeps a second run (or a
-- retry after a lock timeout) from taking the table's lock again.

-- +goose NO TRANSACTION
-- +goose Up

-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'certworker_http01_tokens'::regclass AND NOT attisdropped
                     AND attname = 'claim_token') THEN
        ALTER TABLE certworker_http01_tokens ADD COLUMN IF NOT EXISTS claim_token uuid;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
ALTER TABLE certworker_http01_tokens DROP COLUMN IF EXISTS claim_token;
