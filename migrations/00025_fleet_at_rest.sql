-- Indexes for the fleet-wide duties at rest, so that neither reads every acme row
-- where only a few can matter.
--
-- proxy_domains_unsettled_idx: the acme rows that are not 'active' (pending,
-- provisioning, failed), by status. The fleet statistics (queue.FleetStats) count
-- them every minute from it, an index-only scan of the few rows that are not settled,
-- and the case twins' housekeeping (queue.MarkCaseDuplicates) finds the rows failed
-- as duplicates in it. A row enters it when its renewal starts and leaves it when the
-- renewal ends.
--
-- proxy_domains_twins_idx: the verified acme rows by name in lower case, with the
-- name as written included so that the housekeeping's "names held by two rows" is an
-- index-only scan in name order (a group per name, no hash of the table, no read of
-- the wide rows): about 0.2 s at a million domains where the probe of every row
-- through proxy_domains_lower_domain_idx took 2 s. Without the name included the
-- planner cannot read lower(domain) from the index alone and visits every row.
--
-- Online: both are built CONCURRENTLY, outside a transaction, so the proxy's writes
-- never wait behind the build.

-- +goose NO TRANSACTION
-- +goose Up
CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_unsettled_idx
    ON proxy_domains (ssl_status, verification_status)
    WHERE ssl_provider = 'acme' AND ssl_status <> 'active';

CREATE INDEX CONCURRENTLY IF NOT EXISTS proxy_domains_twins_idx
    ON proxy_domains (lower(domain)) INCLUDE (domain)
    WHERE verification_status = 'verified' AND ssl_provider = 'acme';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS proxy_domains_twins_idx;
DROP INDEX CONCURRENTLY IF EXISTS proxy_domains_unsettled_idx;
