-- The rights `certworker run` needs, and no more, for a role of its own on the
-- proxy's database. `certworker migrate` runs as the owner of the proxy's tables (it
-- alters them, creates tables, functions, triggers, indexes and a publication);
-- `run` needs no DDL and nothing on a table it does not touch (proxy_tenants, for
-- one, it never reads).
--
--   CREATE ROLE certworker_run LOGIN PASSWORD '...';        -- add REPLICATION for --wake logical
--   psql "$DATABASE_URL" -v role=certworker_run -f deploy/grants.sql   -- as the owner, after migrate
--
-- One place for every grant: README.md ("Least privilege") explains them, and
-- cmd/certworker/grants_test.go runs `run` under a role that has exactly these and
-- issues a certificate. A statement that starts touching another table adds its grant
-- here, and the test tells when one is missing.
--
-- Written for psql (:"role" is the role's name, quoted). Every GRANT can run twice.

-- PUBLIC has these by default; an installation that revoked them gives them back to
-- this role alone. (On PostgreSQL 13 and 14 PUBLIC may also CREATE in schema public:
-- REVOKE CREATE ON SCHEMA public FROM PUBLIC keeps the role free of DDL there too.)
GRANT USAGE ON SCHEMA public TO :"role";

-- The queue: claims, leases, results, renewals, hand-backs. No INSERT or DELETE: the
-- proxy owns the rows; certworker moves them between states (the ssl_* columns).
GRANT SELECT, UPDATE ON proxy_domains TO :"role";
-- Stored certificates: written and replaced on issuance (INSERT ... ON CONFLICT),
-- renewal times and renewal information filled in; the certificate and key of a
-- deleted domain pruned an hour after its row was last written.
GRANT SELECT, INSERT, UPDATE, DELETE ON proxy_certificates TO :"role";

-- The ACME account shared by every instance: its key stored, then its URL recorded
-- once the CA has registered it; replaced (deleted and registered again) when the CA
-- no longer knows it.
GRANT SELECT, INSERT, UPDATE, DELETE ON certworker_acme_accounts TO :"role";
-- HTTP-01 tokens of orders in flight, and the responder's reads.
GRANT SELECT, INSERT, UPDATE, DELETE ON certworker_http01_tokens TO :"role";
-- The wake mode and the fleet's settings, recorded at start.
GRANT SELECT, INSERT, UPDATE ON certworker_settings TO :"role";
-- Pauses: a CA's rate limit, its outage or the ledger pauses ordering for every
-- instance; an outage's ends when the CA answers, ended pauses are pruned.
GRANT SELECT, INSERT, UPDATE, DELETE ON certworker_pauses TO :"role";
-- The limit ledger: an order recorded before it is sent, its outcome when it ends,
-- rows older than the longest window pruned.
GRANT SELECT, INSERT, UPDATE, DELETE ON certworker_ledger TO :"role";
-- The names each CA has issued for (which makes their orders renewals), recorded with
-- an issued order, pruned with their domain.
GRANT SELECT, INSERT, UPDATE, DELETE ON certworker_issued_names TO :"role";
-- The order of service: the claim moves the queue's position (the tenants' counters
-- are written by the wake trigger's SECURITY DEFINER function, and pruned).
GRANT SELECT, UPDATE ON certworker_queue_clock TO :"role";
GRANT SELECT, DELETE ON certworker_tenants TO :"role";
-- `run` refuses to start on a schema that is behind or ahead of it.
GRANT SELECT ON goose_db_version TO :"role";
