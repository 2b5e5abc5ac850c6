-- The ledger counts as the CA counts: each limit is a token bucket (GCRA), not a
-- window of rows. certworker_buckets holds each bucket's state, its theoretical
-- arrival time (tat): the bucket is full when tat is past, and the next token comes
-- at tat - DURATION + DURATION/COUNT. Admit writes it in the transaction that admits
-- an order, under the ledger's lock, and SettleLedger when an order's end spends or
-- refunds a token. It depends on no ledger row, so pruning the ledger changes no
-- bucket; a row whose tat is past says no more than no row, and is pruned.
--
-- kind is the limit: 'account' (key: the directory), 'registered_domain',
-- 'exact_set', 'failed_authz' (key: the name) and 'consecutive_failures' (key: the
-- name), the failed authorizations of a name in a row, which a success resets.
--
-- The buckets start from what the ledger holds, under the limits the fleet last
-- recorded (certworker_settings.limits): a bucket's tat after events t1 <= ... <= tn,
-- all admitted, is the greatest of t(i) + (n - i + 1) * DURATION/COUNT. Orders in
-- flight across the upgrade are thus counted as the CA counted them.
--
-- Online: a new table of certworker's own, and a read of its ledger.

-- +goose Up
CREATE TABLE IF NOT EXISTS certworker_buckets (
    directory text NOT NULL,
    kind      text NOT NULL
        CHECK (kind IN ('account', 'registered_domain', 'exact_set', 'failed_authz', 'consecutive_failures')),
    key       text NOT NULL,
    tat       timestamptz NOT NULL,
    PRIMARY KEY (directory, kind, key)
);

INSERT INTO certworker_buckets (directory, kind, key, tat)
SELECT directory, kind, key, max(at + rank * make_interval(secs => t))
FROM (
    SELECT l.directory, v.kind, v.key, l.at, lim.t,
           row_number() OVER (PARTITION BY l.directory, v.kind, v.key ORDER BY l.at DESC, l.id DESC) AS rank
    FROM certworker_ledger l
    CROSS JOIN LATERAL (VALUES
        ('account', l.directory, 'orders_per_account', l.outcome <> 'not_sent' AND NOT l.renewal),
        ('registered_domain', l.registered_domain, 'certs_per_registered_domain',
         l.outcome IN ('pending', 'issued', 'unknown') AND NOT l.renewal),
        ('exact_set', l.name, 'certs_per_exact_set', l.outcome IN ('pending', 'issued', 'unknown')),
        ('failed_authz', l.name, 'failed_authz_per_name', l.outcome = 'failed_authz')
    ) AS v(kind, key, setting, counts)
    CROSS JOIN LATERAL (
        SELECT (s.limits -> v.setting ->> 'window_seconds')::float8
               / (s.limits -> v.setting ->> 'count')::float8 AS t
        FROM certworker_settings s
        WHERE s.id AND jsonb_typeof(s.limits -> v.setting) = 'object'
          AND (s.limits -> v.setting ->> 'count')::float8 > 0
    ) AS lim
    WHERE v.counts
) AS events
GROUP BY directory, kind, key
HAVING max(at + rank * make_interval(secs => t)) > now()
ON CONFLICT (directory, kind, key) DO NOTHING;

-- +goose Down
DROP TABLE IF EXISTS certworker_buckets;
