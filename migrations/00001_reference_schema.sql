-- The proxy's tables, as the reference worker knew them (docs/reference.md, "Schema").
--
-- Values are text with CHECK constraints rather than enum types: the proxy binds them
-- as text, and adding a value to a CHECK is a one-line migration where an enum needs
-- ALTER TYPE outside a transaction.
--
-- On the proxy's database these tables exist already, created by the proxy without
-- the CHECK constraints: CREATE TABLE IF NOT EXISTS skips them (taking no lock), and
-- migration 00006 adds the constraints online. The index is built CONCURRENTLY, so
-- that building it on a table of 100,000 rows does not stop the proxy's writes; hence
-- NO TRANSACTION.

-- +goose NO TRANSACTION
-- +goose Up
CREATE TABLE IF NOT EXISTS proxy_tenants (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name       text NOT NULL,
    slug       text NOT NULL UNIQUE,
    email      text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS proxy_domains (
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id           uuid NOT NULL REFERENCES proxy_tenants (id) ON DELETE CASCADE,
    domain              text NOT NULL UNIQUE,
    verification_status text NOT NULL DEFAULT 'pending'
        CHECK (verification_status IN ('pending', 'verified', 'failed')),
    verification_method text NOT NULL DEFAULT 'dns'
        CHECK (verification_method IN ('dns', 'http')),
    verification_token  text NOT NULL,
    ssl_status          text NOT NULL DEFAULT 'pending'
        CHECK (ssl_status IN ('pending', 'provisioning', 'active', 'failed')),
    ssl_provider        text NOT NULL DEFAULT 'acme'
        CHECK (ssl_provider IN ('acme', 'manual', 'none')),
    -- Signed, and a hand-edited row may make it negative: every reader treats a
    -- negative count as 0.
    ssl_attempts        integer NOT NULL DEFAULT 0,
    ssl_last_attempt_at timestamptz,
    ssl_error           text,
    ssl_expires_at      timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_tenant_idx ON proxy_domains (tenant_id);

CREATE TABLE IF NOT EXISTS proxy_certificates (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    domain          text NOT NULL UNIQUE,
    -- The full chain, leaf first.
    certificate_pem text NOT NULL,
    -- PEM, or the sealed form described in the README when the worker runs with
    -- --key-encryption-key.
    private_key_pem text NOT NULL,
    -- NULL in rows the reference or an operator wrote: the worker
    -- then reads the expiry from certificate_pem.
    expires_at      timestamptz,
    auto_renew      boolean NOT NULL DEFAULT true,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE IF EXISTS proxy_certificates;
DROP TABLE IF EXISTS proxy_domains;
DROP TABLE IF EXISTS proxy_tenants;
