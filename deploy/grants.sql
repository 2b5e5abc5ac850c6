-- The rights `certworker run` needs, and no more, for a role of its own on the
-- proxy's database. `certworker migrate` runs as the owner of the proxy's tables (it
-- alters them, creates tables, functions, triggers, indexes and a publication);
-- `run` needs no DDL and nothing on a table it does not touch (proxy_tenants, for
-- one, it never reads).
--
--   CREATE ROLE certworker_run LOGIN PASSWORD '...';
--   psql "$OWNER_URL" -v role=certworker_run -f deploy/grants.sql   -- as the owner, after migrate
--
-- On the proxy's tables the rights are by column: the workers read only the columns
-- certworker uses, and write only the ssl_* state and the certificates. They cannot
-- move a domain to another tenant, rename it or verify it, and they cannot read a
-- stored private key (certworker writes keys and never reads one back). Column rights
-- follow PostgreSQL's rules: a column read anywhere in a statement (WHERE, RETURNING,
-- the right of SET, an upsert's EXCLUDED) needs SELECT on it; SELECT ... FOR UPDATE
-- needs UPDATE on some column; a column set needs UPDATE, one inserted needs INSERT.
--
-- One place for every grant: docs/security.md ("Least privilege") lists them in a table that
-- cmd/certworker/grants_test.go checks against this file, together with the columns
-- the workers may not read; a column added by a migration must appear in one or the
-- other, or that test fails naming it. The same file runs `run` under a role holding
-- exactly these rights and issues a certificate; a statement that starts touching
-- another column or table adds its grant here and in docs/security.md.
--
-- `--wake logical` also needs the REPLICATION attribute (docs/security.md: "Least privilege"
-- says what it allows, and why it belongs on a role of its own,
-- --replication-database-url).
--
-- Written for psql (:"role" is the role's name, quoted). Every GRANT can run twice.

-- PUBLIC has this by default; an installation that revoked it gives it back to this
-- role alone. (On PostgreSQL 13 and 14 PUBLIC may also CREATE in schema public:
-- REVOKE CREATE ON SCHEMA public FROM PUBLIC keeps this role, and every other, from
-- creating objects there.)
GRANT USAGE ON SCHEMA public TO :"role";

-- The queue: claims, leases, results, renewals, hand-backs. No INSERT or DELETE: the
-- proxy owns the rows. Not readable: verification_method, verification_token,
-- created_at (the proxy's).
GRANT SELECT (id, tenant_id, domain, verification_status, ssl_status, ssl_provider, ssl_attempts,
              ssl_last_attempt_at, ssl_error, ssl_expires_at, updated_at, ssl_claim_token,
              ssl_claimed_by, ssl_lease_expires_at, ssl_queued_at, ssl_claim_prev_attempt_at,
              ssl_queue_seq, ssl_queue_tier, ssl_renew_by, ssl_profile, ssl_profile_refused,
              ssl_ca_directory, ssl_ca_cause, ssl_ca_refused, ssl_ca_refused_cause, ssl_held, ssl_eligible_at,
              ssl_held_until, ssl_waiting_since, ssl_withdrawn_at),
      UPDATE (ssl_status, ssl_attempts, ssl_last_attempt_at, ssl_error, ssl_expires_at, updated_at,
              ssl_claim_token, ssl_claimed_by, ssl_lease_expires_at, ssl_claim_prev_attempt_at,
              ssl_queue_seq, ssl_queue_tier, ssl_renew_by, ssl_profile_refused,
              ssl_ca_directory, ssl_ca_cause, ssl_ca_refused, ssl_ca_refused_cause, ssl_held,
              ssl_held_until, ssl_withdrawn_at)
   ON proxy_domains TO :"role";

-- Stored certificates: written and replaced on issuance (INSERT ... ON CONFLICT),
-- renewal times and renewal information filled in, and the certificate and key of a
-- deleted domain pruned an hour after its row was last written (by row version,
-- ctid, so that a row written meanwhile is left alone); version, so that renewal
-- information is recorded only for the certificate it was read for. Not readable:
-- private_key_pem, created_at. domain and auto_renew are the proxy's.
GRANT SELECT (ctid, id, domain, certificate_pem, expires_at, auto_renew, updated_at, not_before,
              issuer, serial, renew_at, ari_window_start, ari_window_end, ari_next_at, version, profile,
              issuer_directory),
      INSERT (domain, certificate_pem, private_key_pem, expires_at, not_before, issuer, serial,
              renew_at, ari_window_start, ari_window_end, ari_next_at, profile, issuer_directory),
      UPDATE (certificate_pem, private_key_pem, expires_at, not_before, issuer, serial, renew_at,
              ari_window_start, ari_window_end, ari_next_at, updated_at, profile, issuer_directory),
      DELETE
   ON proxy_certificates TO :"role";

-- certworker's own tables. Read whole; written only in the columns the workers set.

-- The ACME account shared by every instance: its key stored, then its URL recorded
-- once the CA has registered it (no transaction is held across the registration);
-- replaced (deleted and registered again) when the CA no longer knows it.
GRANT SELECT, INSERT (directory, eab_kid, email, private_key_pem, uri, registration),
      UPDATE (uri, registration), DELETE
   ON certworker_acme_accounts TO :"role";
-- HTTP-01 tokens of orders in flight and preflight probes, and the responder's reads.
GRANT SELECT, INSERT (token, key_authorization, domain, expires_at, claim_token),
      UPDATE (key_authorization, domain, expires_at, claim_token), DELETE
   ON certworker_http01_tokens TO :"role";
-- The wake mode and the fleet's settings, recorded at start (one row, inserted whole).
GRANT SELECT, INSERT,
      UPDATE (wake, updated_at, retry_base_seconds, retry_max_seconds, max_attempts, limits, dns01_zone,
              dns_target)
   ON certworker_settings TO :"role";
-- DNS-01 values of orders in flight and preflight probes, and the zone server's reads.
GRANT SELECT, INSERT (token, target, value, domain, expires_at, claim_token),
      UPDATE (target, value, domain, expires_at, claim_token), DELETE
   ON certworker_dns01_values TO :"role";
-- Per domain: the challenge chosen and why, and the waiting-for-DNS state.
GRANT SELECT, INSERT, UPDATE, DELETE ON certworker_dns_state TO :"role";
-- Per domain: the ACME order in flight and its key, for whoever takes the domain next.
GRANT SELECT, INSERT, UPDATE, DELETE ON certworker_orders TO :"role";
-- Pauses: a CA's rate limit, its outage or the ledger pauses ordering from that CA
-- for every instance; an outage's ends when the CA answers, ended pauses are pruned.
GRANT SELECT, INSERT (directory, scope, key, source, paused_until, reason, failures, held_since),
      UPDATE (paused_until, reason, failures, updated_at, held_since), DELETE
   ON certworker_pauses TO :"role";
-- The limit ledger: an order recorded before it is sent, its outcome when it ends,
-- rows older than the longest window pruned.
GRANT SELECT, INSERT (directory, domain_id, name, registered_domain, renewal, exempt, claim_token, tenant_id),
      UPDATE (outcome), DELETE
   ON certworker_ledger TO :"role";
-- The ledger's token buckets: written with each order admitted or settled, full ones
-- pruned.
GRANT SELECT, INSERT (directory, kind, key, tat), UPDATE (tat), DELETE
   ON certworker_buckets TO :"role";
-- The names each CA has issued for (which makes their orders renewals), recorded with
-- an issued order, pruned with their domain.
GRANT SELECT, INSERT (directory, name, issued_at), UPDATE (issued_at), DELETE
   ON certworker_issued_names TO :"role";
-- The tenants' counters of migration 00005, unused since 00015 (the wake trigger only
-- reads the queue's index now): pruned. certworker_queue_clock is read and written by
-- no one any more, so the workers hold no right on it.
GRANT SELECT, DELETE ON certworker_tenants TO :"role";
-- The fleet's budget of renewal-information requests, one row per CA (created by the
-- first taker).
GRANT SELECT, INSERT, UPDATE ON certworker_ari_buckets TO :"role";
-- Each domain's history, written with the change it records (certworker_domain_event:
-- a new event, or a repeat counted up), pruned by age and by the rows a domain keeps.
GRANT SELECT, INSERT (domain_id, tenant_id, at, event, reason, message, last_at),
      UPDATE (count, last_at, message), DELETE
   ON certworker_domain_events TO :"role";
-- The fleet's duties (migration 00022): one lease row per duty, taken, renewed and
-- handed on by the instance that does the fleet's maintenance or reads its statistics.
GRANT SELECT, INSERT, UPDATE, DELETE ON certworker_fleet_duties TO :"role";
-- `run` refuses to start on a schema that is behind it or past its window, and on
-- functions that are not the ones it was built with or the next release's.
GRANT SELECT ON goose_db_version TO :"role";
GRANT SELECT ON certworker_functions TO :"role";
GRANT SELECT ON certworker_release TO :"role";

-- The proxy's role (optional: psql -v proxy_role=NAME, as the owner, after migrate).
-- The proxy owns its tables and may do with its own columns what it always did, but
-- certworker's own columns of proxy_domains (the queue's places and holds, the claim,
-- the CA's decisions, ssl_eligible_at) are certworker's: the proxy's role may read
-- them, never write them. A value written there by hand or by a bug of the proxy's
-- could hold a domain back, jump the line or end a claim. The tenant
-- operations (SECURITY INVOKER) run with these rights: what they change of
-- certworker's columns, BEFORE triggers keyed on the proxy's columns change
-- (migrations/functions/certworker_follow_proxy.sql). docs/security.md ("The proxy's
-- role") says the same.
\if :{?proxy_role}
GRANT USAGE ON SCHEMA public TO :"proxy_role";
GRANT SELECT, INSERT, UPDATE, DELETE ON proxy_tenants TO :"proxy_role";
GRANT SELECT,
      INSERT (id, tenant_id, domain, verification_status, verification_method, verification_token,
              ssl_status, ssl_provider, ssl_attempts, ssl_last_attempt_at, ssl_error, ssl_expires_at,
              ssl_profile, created_at, updated_at),
      UPDATE (tenant_id, domain, verification_status, verification_method, verification_token,
              ssl_status, ssl_provider, ssl_attempts, ssl_last_attempt_at, ssl_error, ssl_expires_at,
              ssl_profile, created_at, updated_at),
      DELETE
   ON proxy_domains TO :"proxy_role";
-- Certificates: the proxy serves them, and may upload its own (ssl_provider 'manual');
-- what certworker records about a certificate (renewal time, issuer, ARI window,
-- profile, issuing CA, version) is cleared by its triggers when someone else writes
-- one, and is not the proxy's to write.
GRANT SELECT,
      INSERT (id, domain, certificate_pem, private_key_pem, expires_at, auto_renew, created_at, updated_at),
      UPDATE (domain, certificate_pem, private_key_pem, expires_at, auto_renew, created_at, updated_at),
      DELETE
   ON proxy_certificates TO :"proxy_role";
-- certworker_queue_for_issuance reads the wake mode; certworker_domain_status the
-- settings, waits and pauses behind a domain's state, certworker_domain_events the
-- history (the tenant rule is the functions').
GRANT SELECT ON certworker_settings, certworker_dns_state, certworker_pauses, certworker_domain_events
   TO :"proxy_role";
-- certworker_name_seen (a handshake found no certificate for a name) brings a waiting
-- domain's check forward: those columns alone.
GRANT UPDATE (next_check_at, seen_at) ON certworker_dns_state TO :"proxy_role";
-- The tenant operations, and what to serve for a server name (certworker_certificate_for,
-- which reads proxy_domains and proxy_certificates with the rights above, the keys
-- included).
GRANT EXECUTE ON FUNCTION certworker_queue_for_issuance(uuid, uuid),
                          certworker_update_domain(uuid, uuid, text, text),
                          certworker_set_profile(uuid, uuid, text),
                          certworker_certificate_for(text),
                          certworker_name_seen(text),
                          certworker_domain_status(uuid, uuid),
                          certworker_domain_events(uuid, uuid, integer),
                          certworker_domain_events_since(uuid, bigint, integer)
   TO :"proxy_role";
\endif
