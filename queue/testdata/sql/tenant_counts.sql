
SELECT tenant_id::text, count(*),
       (array_agg(at ORDER BY at))[GREATEST(count(*) - $4 + 1, 1)] + make_interval(secs => $2)
FROM certworker_ledger
 WHERE $2 > 0 AND directory = $1 AND tenant_id = ANY ($3::uuid[]) AND at > now() - make_interval(secs => $2)
   AND outcome <> 'not_sent' AND NOT renewal
 GROUP BY tenant_id