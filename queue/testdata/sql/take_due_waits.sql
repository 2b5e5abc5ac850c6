
UPDATE certworker_dns_state s SET next_check_at = now() + make_interval(secs => $2)
FROM (SELECT s.domain_id, d.tenant_id, d.domain FROM certworker_dns_state s JOIN proxy_domains d ON d.id = s.domain_id
      WHERE s.next_check_at <= now()
      ORDER BY s.next_check_at LIMIT $1
      FOR UPDATE OF s SKIP LOCKED) due
WHERE s.domain_id = due.domain_id
RETURNING s.domain_id::text, due.tenant_id::text, due.domain, COALESCE(s.waiting_since, now()), COALESCE(s.answer, ''),
    (SELECT count(*) FROM certworker_dns_state x
     WHERE x.next_check_at IS NOT NULL AND x.waiting_since < now() - make_interval(secs => $3))::int