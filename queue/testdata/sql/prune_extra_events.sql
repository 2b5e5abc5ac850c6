
SELECT e.ctid FROM certworker_domain_events e
WHERE e.domain_id IN (SELECT r.domain_id FROM certworker_domain_events r WHERE r.at > now() - make_interval(secs => $1))
  AND e.id < (SELECT n.id FROM certworker_domain_events n WHERE n.domain_id = e.domain_id
              ORDER BY n.id DESC OFFSET $2 - 1 LIMIT 1)