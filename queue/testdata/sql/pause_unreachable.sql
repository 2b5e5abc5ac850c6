
INSERT INTO certworker_pauses AS p (directory, scope, key, source, paused_until, reason, failures, held_since)
VALUES ($1, 'ca', $1, 'unreachable', now() + make_interval(secs => $3), $2, 1, now())
ON CONFLICT (directory, scope, key, source) DO UPDATE SET
    held_since = CASE WHEN p.paused_until < now() - make_interval(secs => $5) THEN now()
                      ELSE COALESCE(p.held_since, p.created_at) END,
    failures = CASE WHEN p.paused_until < now() - make_interval(secs => $5) THEN 1
                    WHEN p.paused_until <= now() THEN p.failures + 1 ELSE p.failures END,
    paused_until = CASE WHEN p.paused_until < now() - make_interval(secs => $5)
        THEN now() + make_interval(secs => $3)
        WHEN p.paused_until <= now()
        THEN now() + make_interval(secs => LEAST($3 * power(2, LEAST(p.failures, 30)), $4))
        ELSE p.paused_until END,
    reason = EXCLUDED.reason,
    updated_at = now()
RETURNING failures, (EXTRACT(epoch FROM (paused_until)) - EXTRACT(epoch FROM clock_timestamp()))::float8