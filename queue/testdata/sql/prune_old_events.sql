
SELECT e.ctid FROM certworker_domain_events e
WHERE e.at < now() - make_interval(secs => $1) AND e.last_at < now() - make_interval(secs => $1)