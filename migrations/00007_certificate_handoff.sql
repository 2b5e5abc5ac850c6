-- The hand-off from certworker to whatever serves the certificates (issue #11): a
-- notification in the transaction that stores, replaces or deletes a certificate, so
-- a proxy serves a new certificate within milliseconds of its commit instead of at its
-- next read of the table; and a version the database gives every certificate row, so
-- a reader tells which of two reads of a row is newer without trusting certificate
-- dates (an operator's replacement may well be older than what it replaces).
--
-- Channel certworker_certificate, payload the domain in lower case (docs/reference.md, "Notification channels").
-- README.md ("Serving the certificates") is the reader's side.
--
-- Online, as 00005: NO TRANSACTION, every statement can run twice, the index is built
-- CONCURRENTLY, and the only locks on proxy tables are the catalogue changes'
-- (adding a nullable column without a default, creating triggers), each under the
-- migration's --lock-timeout.

-- +goose NO TRANSACTION
-- +goose Up

-- version: drawn from one sequence for every row, on every insert and on every
-- update that changes the certificate, its key or its domain (not on the worker's
-- bookkeeping: renew_at, the renewal information). One sequence rather than a counter
-- per row, so that a row deleted and inserted again is still newer than anything read
-- before. The trigger draws it while it holds the row's lock, so for one row a larger
-- version was committed later. NULL in a row no one has written since this
-- migration: a reader counts it as 0. No default: a volatile default would rewrite
-- the table under an exclusive lock.
ALTER TABLE proxy_certificates ADD COLUMN IF NOT EXISTS version bigint;

CREATE SEQUENCE IF NOT EXISTS certworker_certificate_version_seq AS bigint;

-- A reader looks a name up as the TLS client sent it, in lower case; the proxy may
-- have stored it in any case (the worker issues for the lower-case name). 00005's
-- index on lower(domain) serves those look-ups.

-- Notifies certworker_certificate with a name in lower case. A payload of 8,000
-- bytes or more makes pg_notify raise, which would fail the proxy's own write; no
-- name is that long, but a hand-edited row might be, and the readers' cache expiry
-- covers a name that cannot be notified.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION certworker_notify_certificate(p_domain text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF octet_length(p_domain) < 8000 THEN
        PERFORM pg_notify('certworker_certificate', lower(p_domain));
    END IF;
END
$$;
-- +goose StatementEnd

-- The certificate row's trigger function. SECURITY DEFINER because it runs with the
-- privileges of whoever writes proxy_certificates (the proxy's role, an operator's
-- upload), who need no right on the sequence. pg_notify in a row trigger is
-- delivered once per transaction per distinct name, at commit, and not at all if the
-- transaction rolls back.
-- +goose StatementBegin
-- Created and revoked from PUBLIC in one DO block (NO TRANSACTION runs each statement
-- on its own): a definer function is never executable by PUBLIC, not even between two
-- statements of a fresh install.
DO $do$
BEGIN
CREATE OR REPLACE FUNCTION certworker_certificate_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM certworker_notify_certificate(OLD.domain);
        RETURN OLD;
    END IF;
    NEW.version := nextval('certworker_certificate_version_seq');
    PERFORM certworker_notify_certificate(NEW.domain);
    IF TG_OP = 'UPDATE' AND lower(OLD.domain) <> lower(NEW.domain) THEN
        PERFORM certworker_notify_certificate(OLD.domain);
    END IF;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION certworker_certificate_changed() FROM PUBLIC;
END
$do$;
-- +goose StatementEnd

-- The domain row's: a verified domain that stops being verified, is renamed, or is
-- deleted stops being served at once, not when the readers' caches expire. A domain
-- becoming verified is left out on purpose: it has no certificate yet (a reader's
-- short miss cache covers the rare manual upload made before verification), and
-- notifying there would put NOTIFY's commit lock back on every "verify", which
-- --wake logical exists to spare.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION certworker_domain_withdrawn() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM certworker_notify_certificate(OLD.domain);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- Insert and update are BEFORE triggers, as they set the version; an INSERT ... ON
-- CONFLICT DO UPDATE fires both (two versions drawn, one notification). The update
-- trigger's WHEN clause keeps the worker's bookkeeping updates (renew_at,
-- ari_next_at) free of both. Each drop and create pair runs in one transaction, so
-- that no write goes unseen in between.
-- +goose StatementBegin
DO $$
BEGIN
    DROP TRIGGER IF EXISTS certworker_certificate_insert ON proxy_certificates;
    CREATE TRIGGER certworker_certificate_insert
        BEFORE INSERT ON proxy_certificates
        FOR EACH ROW EXECUTE FUNCTION certworker_certificate_changed();

    DROP TRIGGER IF EXISTS certworker_certificate_update ON proxy_certificates;
    CREATE TRIGGER certworker_certificate_update
        BEFORE UPDATE ON proxy_certificates
        FOR EACH ROW
        WHEN (OLD.certificate_pem IS DISTINCT FROM NEW.certificate_pem
              OR OLD.private_key_pem IS DISTINCT FROM NEW.private_key_pem
              OR OLD.domain IS DISTINCT FROM NEW.domain)
        EXECUTE FUNCTION certworker_certificate_changed();

    DROP TRIGGER IF EXISTS certworker_certificate_delete ON proxy_certificates;
    CREATE TRIGGER certworker_certificate_delete
        AFTER DELETE ON proxy_certificates
        FOR EACH ROW EXECUTE FUNCTION certworker_certificate_changed();

    DROP TRIGGER IF EXISTS certworker_domain_withdrawn_update ON proxy_domains;
    CREATE TRIGGER certworker_domain_withdrawn_update
        AFTER UPDATE ON proxy_domains
        FOR EACH ROW
        WHEN (OLD.verification_status = 'verified'
              AND (NEW.verification_status <> 'verified' OR NEW.domain IS DISTINCT FROM OLD.domain))
        EXECUTE FUNCTION certworker_domain_withdrawn();

    DROP TRIGGER IF EXISTS certworker_domain_withdrawn_delete ON proxy_domains;
    CREATE TRIGGER certworker_domain_withdrawn_delete
        AFTER DELETE ON proxy_domains
        FOR EACH ROW
        WHEN (OLD.verification_status = 'verified')
        EXECUTE FUNCTION certworker_domain_withdrawn();
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    DROP TRIGGER IF EXISTS certworker_domain_withdrawn_delete ON proxy_domains;
    DROP TRIGGER IF EXISTS certworker_domain_withdrawn_update ON proxy_domains;
    DROP TRIGGER IF EXISTS certworker_certificate_delete ON proxy_certificates;
    DROP TRIGGER IF EXISTS certworker_certificate_update ON proxy_certificates;
    DROP TRIGGER IF EXISTS certworker_certificate_insert ON proxy_certificates;
END
$$;
-- +goose StatementEnd
DROP FUNCTION IF EXISTS certworker_domain_withdrawn();
DROP FUNCTION IF EXISTS certworker_certificate_changed();
DROP FUNCTION IF EXISTS certworker_notify_certificate(text);
DROP SEQUENCE IF EXISTS certworker_certificate_version_seq;
ALTER TABLE proxy_certificates DROP COLUMN IF EXISTS version;
