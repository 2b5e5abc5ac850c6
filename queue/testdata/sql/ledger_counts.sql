
SELECT 'account', $1::text, count(*), min(at) + make_interval(secs => $2) FROM certworker_ledger
 WHERE $2 > 0 AND directory = $1 AND at > now() - make_interval(secs => $2) AND outcome <> 'not_sent' AND NOT renewal
UNION ALL
SELECT 'registered_domain', registered_domain, count(*), min(at) + make_interval(secs => $3) FROM certworker_ledger
 WHERE $3 > 0 AND directory = $1 AND registered_domain = ANY($4) AND at > now() - make_interval(secs => $3)
   AND outcome IN ('pending', 'issued', 'unknown') AND NOT renewal
 GROUP BY registered_domain
UNION ALL
SELECT 'exact_set', name, count(*), min(at) + make_interval(secs => $5) FROM certworker_ledger
 WHERE $5 > 0 AND directory = $1 AND name = ANY($6) AND at > now() - make_interval(secs => $5)
   AND outcome IN ('pending', 'issued', 'unknown')
 GROUP BY name
UNION ALL
SELECT 'failed_authz', name, count(*), min(at) + make_interval(secs => $7) FROM certworker_ledger
 WHERE $7 > 0 AND directory = $1 AND name = ANY($6) AND at > now() - make_interval(secs => $7)
   AND outcome = 'failed_authz'
 GROUP BY name