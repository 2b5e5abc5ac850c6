
UPDATE certworker_dns_state
SET next_check_at = now() + make_interval(secs => CASE WHEN seen_at > now() - make_interval(secs => $5::float8)
                                                      THEN LEAST($2::float8, $4::float8) ELSE $2::float8 END),
    taken_until = NULL, answer = $3, updated_at = now()
WHERE domain_id = $1::uuid AND next_check_at IS NOT NULL
RETURNING (SELECT certworker_domain_event(d.id, d.tenant_id, 'waiting_for_dns', certworker_domain_reason(d.ssl_error), d.ssl_error, now()) FROM proxy_domains d
           WHERE $6 AND d.id = $1::uuid AND d.verification_status = 'verified' AND d.ssl_provider = 'acme' AND d.ssl_status = 'pending' AND d.ssl_held = 'dns'
             AND d.ssl_error LIKE 'waiting for DNS:%')