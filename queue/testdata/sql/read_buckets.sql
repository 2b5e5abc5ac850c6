
SELECT now(), b.kind, b.key, b.tat
FROM (SELECT 1) AS one
LEFT JOIN certworker_buckets b ON b.directory = $1 AND (
       (b.kind = 'account' AND b.key = $1)
    OR (b.kind = 'registered_domain' AND b.key = ANY ($2::text[]))
    OR (b.kind IN ('exact_set', 'failed_authz', 'consecutive_failures') AND b.key = ANY ($3::text[])))