
DELETE FROM certworker_dns_state s
WHERE s.next_check_at <= now() AND NOT EXISTS (SELECT 1 FROM proxy_domains d WHERE d.id = s.domain_id)