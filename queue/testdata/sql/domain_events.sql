
SELECT id, at, event, reason, message, count, last_at FROM certworker_domain_events($1, $2, $3)