-- A second ACME CA (issue #19): when the first cannot issue (down, its limits, a name it
-- refuses), a verified domain is ordered from --acme-fallback-directory instead. Each
-- CA has its own account (certworker_acme_accounts is keyed by directory already), its
-- own ledger (certworker_ledger.directory) and its own pauses: nothing one CA says
-- holds a domain back at the other. README.md ("A second CA") has the rules.
--
-- Online, as 00014: NO TRANSACTION, every statement can run twice, the new columns are
-- nullable without a default or carry a constant default (a catalogue change, no
-- rewrite), ALTER TABLE on a proxy table runs only when a column is missing, and every
-- lock is taken under migrate's --lock-timeout. certworker_pauses is certworker's own
-- and small (the pauses in force, and ended ones for a while): its key is swapped in
-- one short transaction, on an index built CONCURRENTLY first.

-- +goose NO TRANSACTION
-- +goose Up

-- certworker_pauses.directory: the CA a pause belongs to. A 'ca' pause's key was its
-- directory already, and is copied; a registered domain's or a name's pause now names
-- its CA too. '' is a pause written before this migration (or by an instance started
-- without a directory): it belongs to the first CA (--acme-directory), which was the
-- only one then.
--
-- held_since: when the hold this row records began: set when the row is written while
-- no pause of it is in force, kept while one is extended. The claim measures how long
-- a domain has been held back from it (--acme-fallback-after); created_at is when the
-- row was first written, which an ended pause written again does not move. NULL in a
-- row written before this migration: created_at stands in.
-- +goose StatementBegin
DO $$
BEGIN
    IF (SELECT count(*) FROM pg_attribute
        WHERE attrelid = 'certworker_pauses'::regclass AND NOT attisdropped
          AND attname IN ('directory', 'held_since')) < 2 THEN
        ALTER TABLE certworker_pauses
            ADD COLUMN IF NOT EXISTS directory text NOT NULL DEFAULT '',
            ADD COLUMN IF NOT EXISTS held_since timestamptz;
    END IF;
END
$$;
-- +goose StatementEnd

UPDATE certworker_pauses SET directory = key WHERE scope = 'ca' AND directory = '';

-- A fleet that has only ever had one CA: its pauses are that CA's.
UPDATE certworker_pauses p SET directory = a.directory
FROM (SELECT min(directory) AS directory FROM certworker_acme_accounts
      HAVING count(DISTINCT directory) = 1) a
WHERE p.scope <> 'ca' AND p.directory = '';

CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS certworker_pauses_directory_key
    ON certworker_pauses (directory, scope, key, source);

-- The key becomes (directory, scope, key, source). An instance of the previous release
-- still running writes its pauses ON CONFLICT (scope, key, source), which no longer
-- names a key: such a write fails (logged, the claim handed back all the same) until
-- the instance is replaced, as `certworker run` refuses to start on a schema ahead of
-- it (migrations.Check).
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = 'certworker_pauses'::regclass AND contype = 'p'
                     AND conname = 'certworker_pauses_directory_key') THEN
        ALTER TABLE certworker_pauses DROP CONSTRAINT IF EXISTS certworker_pauses_pkey,
            ADD CONSTRAINT certworker_pauses_directory_key PRIMARY KEY USING INDEX certworker_pauses_directory_key;
    END IF;
END
$$;
-- +goose StatementEnd

-- proxy_domains, written by the claim and the worker only:
--   ssl_ca_directory: the CA the domain's last claim went to (its ACME directory);
--   ssl_ca_cause: why that was the second CA (queue.FallbackOutage, ...), NULL for the
--     first. The claim decides both in the statement that takes the row, so every
--     instance reads one decision, and a domain is never ordered at both CAs at once;
--   ssl_ca_refused: the directory of a CA that refused the name for good (caa,
--     rejectedIdentifier, unsupportedIdentifier) or that the name's CAA records
--     forbid: the domain's orders go to the other, at once, until its next
--     certificate is stored or `certworker retry` clears it.
-- +goose StatementBegin
DO $$
BEGIN
    IF (SELECT count(*) FROM pg_attribute
        WHERE attrelid = 'proxy_domains'::regclass AND NOT attisdropped
          AND attname IN ('ssl_ca_directory', 'ssl_ca_cause', 'ssl_ca_refused')) < 3 THEN
        ALTER TABLE proxy_domains
            ADD COLUMN IF NOT EXISTS ssl_ca_directory text,
            ADD COLUMN IF NOT EXISTS ssl_ca_cause text,
            ADD COLUMN IF NOT EXISTS ssl_ca_refused text;
    END IF;
END
$$;
-- +goose StatementEnd

-- issuer_directory: the ACME directory of the CA that issued the certificate, written
-- by the worker with it (proxy_certificates.issuer is the X.509 issuer's name). NULL
-- for a certificate stored before this migration, or uploaded (the trigger below
-- clears it): such a certificate is renewed by the first CA, as before.
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'proxy_certificates'::regclass AND NOT attisdropped
                     AND attname = 'issuer_directory') THEN
        ALTER TABLE proxy_certificates ADD COLUMN IF NOT EXISTS issuer_directory text;
    END IF;
END
$$;
-- +goose StatementEnd

-- 00016's, which also forgets the issuing CA now: a certificate someone else wrote
-- was not issued through any account certworker knows.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION certworker_certificate_replaced() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.renew_at := NULL;
    NEW.not_before := NULL;
    NEW.issuer := NULL;
    NEW.serial := NULL;
    NEW.ari_window_start := NULL;
    NEW.ari_window_end := NULL;
    NEW.ari_next_at := NULL;
    NEW.profile := NULL;
    NEW.issuer_directory := NULL;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION certworker_certificate_replaced() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.renew_at := NULL;
    NEW.not_before := NULL;
    NEW.issuer := NULL;
    NEW.serial := NULL;
    NEW.ari_window_start := NULL;
    NEW.ari_window_end := NULL;
    NEW.ari_next_at := NULL;
    NEW.profile := NULL;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- Back to one pause per (scope, key, source): the second CA's go, the first's stay.
-- The columns stay (dropping one takes an exclusive lock; the proxy may read them).
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = 'certworker_pauses'::regclass AND contype = 'p'
                     AND conname = 'certworker_pauses_pkey') THEN
        DELETE FROM certworker_pauses p
        WHERE EXISTS (SELECT 1 FROM certworker_pauses o
                      WHERE o.scope = p.scope AND o.key = p.key AND o.source = p.source
                        AND (o.paused_until, o.directory) > (p.paused_until, p.directory));
        ALTER TABLE certworker_pauses DROP CONSTRAINT IF EXISTS certworker_pauses_directory_key,
            ADD CONSTRAINT certworker_pauses_pkey PRIMARY KEY (scope, key, source);
    END IF;
END
$$;
-- +goose StatementEnd
