
UPDATE certworker_dns_state SET next_check_at = now() + make_interval(secs => $2), answer = $3, updated_at = now()
WHERE domain_id = $1::uuid AND next_check_at IS NOT NULL