
SELECT domain_id::text, domain, state, reason, message, next_check_at, point_to, cname_target, challenge,
    expires_at, renew_at
FROM certworker_domain_status($1, $2)