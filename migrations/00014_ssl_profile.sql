-- A profile per domain (issue #18): a tenant picks the ACME profile its domain's
-- certificates are issued under (Let's Encrypt's classic, tlsserver, shortlived...),
-- and every certificate certworker stores records the profile it was issued under, so
-- that a change of profile can be told from a certificate that already has it.
-- docs/cas.md ("Profiles") has the rules.
--
-- Online, as 00005 and 00007: NO TRANSACTION, every statement can run twice, the
-- columns are nullable without a default (a catalogue change, no rewrite), ALTER
-- TABLE runs only when a column is missing (it takes an ACCESS EXCLUSIVE lock even
-- when there is nothing to add), the index is built CONCURRENTLY, and every lock on a
-- proxy table is taken under migrate's --lock-timeout.

-- +goose NO TRANSACTION
-- +goose Up

-- ssl_profile: the domain's own profile, set by the tenant (certworker_set_profile,
-- below); NULL orders under the worker's --acme-profile, which itself may be empty
-- for the CA's default (the order then names none).
--
-- ssl_profile_refused: the domain's profile that the CA does not offer (its
-- directory's meta.profiles does not list it, or it answered invalidProfile), set by
-- the worker. While it equals ssl_profile, a domain that holds a certificate keeps
-- it and renews under the certificate's profile, and its certificate is not replaced
-- for the profile: without it, the replacement would be tried, and refused, on every
-- pass. certworker_set_profile clears it: setting a profile, even the same one again,
-- is asking again.
-- +goose StatementBegin
DO $$
BEGIN
    IF (SELECT count(*) FROM pg_attribute
        WHERE attrelid = 'proxy_domains'::regclass AND NOT attisdropped
          AND attname IN ('ssl_profile', 'ssl_profile_refused')) < 2 THEN
        ALTER TABLE proxy_domains
            ADD COLUMN IF NOT EXISTS ssl_profile text,
            ADD COLUMN IF NOT EXISTS ssl_profile_refused text;
    END IF;
END
$$;
-- +goose StatementEnd

-- profile: the profile a certificate was issued under, as the CA's order named it,
-- written by the worker with the certificate. NULL for every row stored before this
-- migration, and for one the proxy or an operator uploads (the trigger below clears
-- it): a certificate with no recorded profile matches any, so this migration starts
-- no replacement.
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'proxy_certificates'::regclass AND NOT attisdropped
                     AND attname = 'profile') THEN
        ALTER TABLE proxy_certificates ADD COLUMN IF NOT EXISTS profile text;
    END IF;
END
$$;
-- +goose StatementEnd

-- 00006's, which also forgets the profile now: a certificate someone else wrote was
-- not issued under anything certworker knows.
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
    NEW.profile := NULL;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- The tenant's "certificate profile" setting, following certworker_update_domain. One
-- row, the domain as it now is, when it was set; no row, and nothing changed, when it
-- is refused: another tenant's domain, or a value that is not a profile name. A name
-- is 1 to 64 characters, ASCII letters, digits, '.', '_' and '-', starting with a
-- letter or digit (Let's Encrypt's are classic, tlsserver, shortlived): the tenant
-- controls it, and it goes into orders, logs and ssl_error. The empty string is
-- refused rather than read as "the CA's default": NULL puts the domain back on the
-- worker's --acme-profile, and which default that is belongs to the operator.
--
-- Whether the CA offers the profile is not checked here (the database does not know
-- the CA); the worker checks before it orders, and says so in ssl_error. Setting it
-- clears what the worker recorded of a refused profile: a domain that failed because
-- the CA does not offer its profile is queued again, and an active one loses the note
-- in ssl_error. An active, verified acme domain whose certificate was issued under
-- another profile is queued at once to replace it (the worker orders it naming the
-- certificate in "replaces", and the domain keeps its certificate meanwhile); one whose
-- certificate has no recorded profile keeps it, and renews under the new profile when
-- it is due, as does every domain set back to NULL (--acme-profile applies at each
-- renewal). A domain queued is pending with its history cleared, as
-- certworker_queue_for_issuance leaves it, and the wake trigger wakes the workers. The
-- replacement rule is queue.RequeueProfileChanges's too, which the workers run now and
-- then for a profile written without this function, or set while an order was running;
-- the two have to agree.
--
-- Any state is accepted (not verified, provisioning, another provider): the setting
-- is the tenant's, and applies to the next order. The caller needs SELECT on
-- proxy_certificates besides SELECT and UPDATE on proxy_domains.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION certworker_set_profile(p_domain_id uuid, p_tenant_id uuid, p_profile text)
RETURNS SETOF proxy_domains
LANGUAGE sql SECURITY INVOKER AS $$
    WITH d AS (
        SELECT d.id,
            (d.ssl_profile_refused IS NOT NULL AND d.ssl_status = 'failed' AND d.ssl_provider = 'acme')
            OR (d.ssl_status = 'active' AND d.ssl_provider = 'acme' AND d.verification_status = 'verified'
                AND EXISTS (SELECT 1 FROM public.proxy_certificates c
                            WHERE c.domain = d.domain AND c.auto_renew
                              AND c.profile IS NOT NULL AND c.profile <> p_profile)) AS queue
        FROM public.proxy_domains d
        WHERE d.id = p_domain_id AND d.tenant_id = p_tenant_id
          AND (p_profile IS NULL OR p_profile ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$')
        FOR UPDATE OF d
    )
    UPDATE public.proxy_domains x SET
        ssl_profile = p_profile,
        ssl_profile_refused = NULL,
        ssl_status = CASE WHEN d.queue THEN 'pending' ELSE x.ssl_status END,
        ssl_attempts = CASE WHEN d.queue THEN 0 ELSE x.ssl_attempts END,
        ssl_last_attempt_at = CASE WHEN d.queue THEN NULL ELSE x.ssl_last_attempt_at END,
        ssl_error = CASE WHEN x.ssl_profile_refused IS NOT NULL AND x.ssl_status IN ('failed', 'active')
                         THEN NULL ELSE x.ssl_error END,
        updated_at = now()
    FROM d
    WHERE x.id = d.id
    RETURNING x.*
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION certworker_set_profile(uuid, uuid, text) IS
    'SECURITY INVOKER on purpose: runs with the rights of the caller (the proxy''s role), which must hold SELECT and UPDATE on proxy_domains. Never make it SECURITY DEFINER (migrations/embed.go).';

-- The domains with a profile of their own: what the workers' housekeeping compares
-- with their certificates' (queue.RequeueProfileChanges) and `status` counts, read
-- through this index rather than the whole table. And the few whose profile the CA
-- refused, which `status` lists.
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_profile_idx
    ON proxy_domains (ssl_profile) WHERE ssl_profile IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_profile_refused_idx
    ON proxy_domains (ssl_profile_refused) WHERE ssl_profile_refused IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS proxy_domains_profile_refused_idx;
DROP INDEX CONCURRENTLY IF EXISTS proxy_domains_profile_idx;
DROP FUNCTION IF EXISTS certworker_set_profile(uuid, uuid, text);
-- The columns stay: the proxy may read them, and dropping one takes an exclusive
-- lock; 00006's trigger function would only set profile to NULL, which is harmless.
