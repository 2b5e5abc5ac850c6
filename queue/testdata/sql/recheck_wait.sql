
UPDATE certworker_dns_state
SET next_check_at = now() + make_interval(secs => CASE WHEN seen_at > now() - make_interval(secs => $5::float8)
                                                      THEN LEAST($2::float8, $4::float8) ELSE $2::float8 END),
    taken_until = NULL, answer = $3, updated_at = now()
WHERE domain_id = $1::uuid AND next_check_at IS NOT NULL