
UPDATE certworker_dns_state SET next_check_at = NULL, taken_until = NULL, waiting_since = NULL, paced_since = NULL,
    updated_at = now()
WHERE domain_id = $1::uuid