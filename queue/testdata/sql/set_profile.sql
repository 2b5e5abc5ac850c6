
SELECT id::text, tenant_id::text, domain, verification_status, verification_method,
    ssl_status, ssl_provider, ssl_attempts, ssl_error, ssl_last_attempt_at, ssl_expires_at, ssl_profile FROM certworker_set_profile($1, $2, $3)