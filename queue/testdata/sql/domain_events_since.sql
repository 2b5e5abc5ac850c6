
SELECT id, domain_id::text, at, event, reason, message, count, last_at FROM certworker_domain_events_since($1, $2, $3)