
INSERT INTO certworker_pauses AS p (directory, scope, key, source, paused_until, reason, held_since)
VALUES ($6, $1, $2, $3, now() + make_interval(secs => $4), $5, now())
ON CONFLICT (directory, scope, key, source) DO UPDATE SET
    held_since = CASE WHEN p.paused_until > now() THEN COALESCE(p.held_since, p.created_at) ELSE now() END,
    paused_until = GREATEST(p.paused_until, EXCLUDED.paused_until),
    reason = CASE WHEN EXCLUDED.paused_until > p.paused_until THEN EXCLUDED.reason ELSE p.reason END,
    updated_at = now()
RETURNING (EXTRACT(epoch FROM (paused_until)) - EXTRACT(epoch FROM clock_timestamp()))::float8