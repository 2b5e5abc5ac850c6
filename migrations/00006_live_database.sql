-- The proxy's live database. certworker is not given a fresh database: it
-- is pointed at the one the proxy and the reference worker have used for years, whose
-- tables were created without the CHECK constraints on its state columns (00001's
-- CREATE TABLE IF NOT EXISTS skips an existing table whole), whose
-- proxy_certificates.expires_at allows NULL, and whose rows the proxy keeps writing
-- while this runs. This migration brings such a database to the contract's schema,
-- and adds what the proxy calls: the tenant operations as SQL functions, so that the
-- proxy (in Rust) and certworker share one implementation.
--
-- Online: every statement runs under migrate's --lock-timeout and is retried when it
-- gives up; no statement holds a lock that stops the proxy's writes for longer than
-- it takes to change a catalogue entry. Idempotent: every step checks the catalogue
-- first and takes no lock when there is nothing to do, so that a run interrupted half
-- way is finished by the next. Before any of it runs, migrate's preflight has checked
-- the rows against the value sets below (migrations/preflight.go, which lists them
-- too) and refused, changing nothing, if one breaks them.

-- +goose NO TRANSACTION
-- +goose Up

-- The reference allowed NULL (it wrote NULL when it did not know the expiry, and so do
-- operators uploading by hand); 00001 said NOT NULL until this migration. DROP NOT NULL
-- changes the catalogue only, but takes an ACCESS EXCLUSIVE lock: only when needed.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = 'proxy_certificates'::regclass AND attname = 'expires_at'
                 AND attnotnull) THEN
        ALTER TABLE proxy_certificates ALTER COLUMN expires_at DROP NOT NULL;
    END IF;
END
$$;
-- +goose StatementEnd

-- The value sets, under the names PostgreSQL gives 00001's column constraints, so that
-- a database created by 00001 and one brought here end up alike. Added NOT VALID: the
-- ACCESS EXCLUSIVE lock is held only to write the catalogue, not while 100,000 rows
-- are read (every write is checked from this moment). The missing ones are added in
-- one ALTER TABLE: one lock, not four.
-- +goose StatementBegin
DO $$
DECLARE
    v_add text[] := '{}';
    v_set record;
BEGIN
    FOR v_set IN
        SELECT * FROM (VALUES
            ('proxy_domains_verification_status_check',
             $c$CHECK (verification_status IN ('pending', 'verified', 'failed'))$c$),
            ('proxy_domains_verification_method_check',
             $c$CHECK (verification_method IN ('dns', 'http'))$c$),
            ('proxy_domains_ssl_status_check',
             $c$CHECK (ssl_status IN ('pending', 'provisioning', 'active', 'failed'))$c$),
            ('proxy_domains_ssl_provider_check',
             $c$CHECK (ssl_provider IN ('acme', 'manual', 'none'))$c$)
        ) AS s (name, def)
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_constraint
                       WHERE conrelid = 'proxy_domains'::regclass AND conname = v_set.name) THEN
            v_add := v_add || format('ADD CONSTRAINT %I %s NOT VALID', v_set.name, v_set.def);
        END IF;
    END LOOP;
    IF cardinality(v_add) > 0 THEN
        EXECUTE 'ALTER TABLE proxy_domains ' || array_to_string(v_add, ', ');
    END IF;
END
$$;
-- +goose StatementEnd

-- VALIDATE reads every row under a SHARE UPDATE EXCLUSIVE lock, which the proxy's
-- reads and writes do not wait for.
-- +goose StatementBegin
DO $$
DECLARE
    v_name name;
BEGIN
    FOR v_name IN
        SELECT conname FROM pg_constraint
        WHERE conrelid = 'proxy_domains'::regclass AND NOT convalidated
          AND conname IN ('proxy_domains_verification_status_check',
                          'proxy_domains_verification_method_check',
                          'proxy_domains_ssl_status_check',
                          'proxy_domains_ssl_provider_check')
    LOOP
        EXECUTE format('ALTER TABLE proxy_domains VALIDATE CONSTRAINT %I', v_name);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- `status DOMAIN` and `retry DOMAIN` look names up in any case (operators type them as
-- a browser shows them), and the worker looks for names that differ only in case,
-- through 00005's index on lower(domain). Not unique: the proxy's own unique
-- constraint is on the name as written, and a database that has years of rows may
-- hold two that differ only in case; the worker marks those failed
-- (queue.MarkCaseDuplicates) and the look-ups refuse to choose.

-- The proxy's "retry" for a tenant (the reference's saas::db::queue_for_issuance):
-- puts the tenant's domain back in the queue with its history cleared (pending,
-- attempts 0, error and last attempt cleared, so that the next pass takes it rather
-- than waiting out a backoff computed for a cause the tenant has just fixed). One row,
-- the domain as it now is, when it was queued; no row, and nothing changed, when it is
-- refused: another tenant's domain (a tenant never touches another's), one that is not
-- verified (an order for a name nobody has proved control of spends a rate limit for
-- nothing), not acme (its certificate is not ours to order), or already provisioning
-- or active (an order is running, or the certificate is renewed on its own schedule).
--
-- A failed domain entering the queue wakes the workers through the trigger; a pending
-- one (backing off) is in the claimable set already, so the trigger stays silent and
-- the function notifies itself, in notify mode as the trigger does.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION certworker_queue_for_issuance(p_domain_id uuid, p_tenant_id uuid)
RETURNS SETOF proxy_domains
LANGUAGE plpgsql AS $$
DECLARE
    v_status text;
BEGIN
    SELECT ssl_status INTO v_status FROM proxy_domains
    WHERE id = p_domain_id AND tenant_id = p_tenant_id
      AND verification_status = 'verified' AND ssl_provider = 'acme'
      AND ssl_status IN ('failed', 'pending')
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
        UPDATE proxy_domains SET
            ssl_status = 'pending', ssl_attempts = 0, ssl_error = NULL,
            ssl_last_attempt_at = NULL, updated_at = now()
        WHERE id = p_domain_id
        RETURNING *;
    IF v_status = 'pending'
       AND COALESCE((SELECT wake FROM certworker_settings WHERE id), 'notify') = 'notify' THEN
        PERFORM pg_notify('certworker_wake', '');
    END IF;
END
$$;
-- +goose StatementEnd

-- The proxy's domain update for a tenant (the reference's saas::db::update_domain):
-- a NULL argument leaves its field alone. Changing the provider resets the SSL state
-- to a fresh 'pending' with no history and drops any claim, so that a verified domain
-- switched to acme is queued (the wake trigger sees it enter the claimable set) rather
-- than left in whatever state the old provider left it, and an order running for a
-- domain switched away from acme cannot store its result (its claim is gone). One row,
-- the domain as it now is; no row, and nothing changed, for another tenant's domain.
-- A value outside the contract's sets fails with the CHECK constraint's error.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION certworker_update_domain(
    p_domain_id uuid, p_tenant_id uuid, p_verification_method text, p_ssl_provider text)
RETURNS SETOF proxy_domains
LANGUAGE sql AS $$
    UPDATE proxy_domains SET
        verification_method = COALESCE(p_verification_method, verification_method),
        ssl_status = CASE WHEN p_ssl_provider <> ssl_provider THEN 'pending' ELSE ssl_status END,
        ssl_attempts = CASE WHEN p_ssl_provider <> ssl_provider THEN 0 ELSE ssl_attempts END,
        ssl_error = CASE WHEN p_ssl_provider <> ssl_provider THEN NULL ELSE ssl_error END,
        ssl_last_attempt_at = CASE WHEN p_ssl_provider <> ssl_provider THEN NULL ELSE ssl_last_attempt_at END,
        ssl_claim_token = CASE WHEN p_ssl_provider <> ssl_provider THEN NULL ELSE ssl_claim_token END,
        ssl_claimed_by = CASE WHEN p_ssl_provider <> ssl_provider THEN NULL ELSE ssl_claimed_by END,
        ssl_lease_expires_at = CASE WHEN p_ssl_provider <> ssl_provider THEN NULL ELSE ssl_lease_expires_at END,
        ssl_provider = COALESCE(p_ssl_provider, ssl_provider),
        updated_at = now()
    WHERE id = p_domain_id AND tenant_id = p_tenant_id
    RETURNING *
$$;
-- +goose StatementEnd

-- A certificate replaced by someone else (the proxy, an operator uploading one): its
-- renewal time and what the worker recorded about it belong to the old certificate.
-- Left as they were, a shorter-lived upload expires before its renewal, or a time
-- already past makes the worker overwrite the upload at once. They are cleared, and
-- the worker works them out again from the new certificate_pem on its next renewal
-- pass, as for any row it did not write.
--
-- The worker's own write (queue.MarkActive) sets renew_at with certificate_pem, in the
-- same statement; a write that changes the certificate and leaves renew_at as it was
-- is somebody else's. An operator who sets renew_at along with the certificate keeps
-- it. A separate trigger from the NOTIFY one on the same table (00007).
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
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'proxy_certificates'::regclass
                   AND tgname = 'certworker_certificate_replaced') THEN
        CREATE TRIGGER certworker_certificate_replaced
            BEFORE UPDATE OF certificate_pem ON proxy_certificates
            FOR EACH ROW
            WHEN (NEW.certificate_pem IS DISTINCT FROM OLD.certificate_pem
                  AND NEW.renew_at IS NOT DISTINCT FROM OLD.renew_at)
            EXECUTE FUNCTION certworker_certificate_replaced();
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The constraints stay (00001 declares them on a new database) and expires_at stays
-- nullable (the contract allows NULL).
DROP TRIGGER IF EXISTS certworker_certificate_replaced ON proxy_certificates;
DROP FUNCTION IF EXISTS certworker_certificate_replaced();
DROP FUNCTION IF EXISTS certworker_update_domain(uuid, uuid, text, text);
DROP FUNCTION IF EXISTS certworker_queue_for_issuance(uuid, uuid);
