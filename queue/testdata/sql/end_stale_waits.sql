
UPDATE certworker_dns_state s SET next_check_at = NULL, waiting_since = NULL, updated_at = now()
WHERE s.next_check_at <= now()
  AND NOT EXISTS (SELECT 1 FROM proxy_domains d WHERE d.id = s.domain_id
                  AND verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND d.ssl_held = 'dns')