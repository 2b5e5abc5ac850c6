-- DNS-01 by delegation and waiting for DNS (docs/cas.md, "DNS-01 by delegation" and
-- "Waiting for DNS").
--
-- certworker_dns01_values: the TXT values of DNS-01 orders in flight and of the
-- preflight's probes, which the zone's authoritative server of every instance answers
-- (acme/dns01.go). A row is written under the order's claim (claim_token, as
-- certworker_http01_tokens since 00011) and deleted when the order is over; expires_at
-- ends the life of a dead instance's rows. target is the label under --dns01-zone
-- (certworker_dns01_target without the zone), in lower case.
--
-- certworker_dns_state: per domain, the challenge last chosen and why (for `status`),
-- and the waiting-for-DNS state: since when, when it is checked next, and a
-- fingerprint of the answer last seen (the HTTP probe runs again only when it changed).
-- No foreign key to proxy_domains: a write of certworker's must never wait on the
-- proxy's row locks; rows of deleted domains are pruned by the worker.
--
-- certworker_settings.dns01_zone: the zone `run` serves (NULL: DNS-01 off), which
-- certworker_dns01_target (migrations/functions/) reads, since the database does not
-- know the flag.
--
-- Online: new tables of certworker's own, a nullable column without a default on
-- certworker's own settings table (a catalogue change).

-- +goose NO TRANSACTION
-- +goose Up

CREATE TABLE IF NOT EXISTS certworker_dns01_values (
    token       text PRIMARY KEY,
    target      text NOT NULL,
    value       text NOT NULL,
    domain      text NOT NULL,
    claim_token uuid,
    expires_at  timestamptz NOT NULL
);

CREATE INDEX IF NOT EXISTS certworker_dns01_values_target ON certworker_dns01_values (target);

CREATE TABLE IF NOT EXISTS certworker_dns_state (
    domain_id        uuid PRIMARY KEY,
    challenge        text CHECK (challenge IN ('http-01', 'dns-01')),
    challenge_reason text,
    challenge_at     timestamptz,
    waiting_since    timestamptz,
    next_check_at    timestamptz,
    answer           text,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- The claim skips a waiting domain until its next check (queue/claim.go).
CREATE INDEX IF NOT EXISTS certworker_dns_state_next_check
    ON certworker_dns_state (next_check_at) WHERE next_check_at IS NOT NULL;

-- NextDue's reads of the queue by attempts skip the domains waiting for their DNS
-- (ssl_held 'dns'), which are due when their DNS check says so, not by backoff: in
-- proxy_domains_backoff_idx they would come first (never tried: NULLS FIRST), and
-- 100,000 of them would be read through on every pass.
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_due_idx
    ON proxy_domains (ssl_attempts, ssl_last_attempt_at NULLS FIRST)
    WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending'
      AND ssl_held IS DISTINCT FROM 'dns';

-- The waiting domains someone retried (the proxy's retry or `certworker retry`
-- cleared their 'waiting for DNS:' error): few at a time, found by the waiter at
-- every tick and put back in line.
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_wait_retried_idx
    ON proxy_domains (id)
    WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending'
      AND ssl_held = 'dns' AND (ssl_error IS NULL OR ssl_error NOT LIKE 'waiting for DNS:%');

-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'certworker_settings'::regclass AND NOT attisdropped
                     AND attname = 'dns01_zone') THEN
        ALTER TABLE certworker_settings ADD COLUMN IF NOT EXISTS dns01_zone text;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP INDEX IF EXISTS proxy_domains_wait_retried_idx;
DROP INDEX IF EXISTS proxy_domains_due_idx;
DROP FUNCTION IF EXISTS public.certworker_dns01_target(text);
ALTER TABLE certworker_settings DROP COLUMN IF EXISTS dns01_zone;
DROP TABLE IF EXISTS certworker_dns_state;
DROP TABLE IF EXISTS certworker_dns01_values;
