
INSERT INTO certworker_pauses AS p (directory, scope, key, source, paused_until, reason, held_since)
VALUES ($5, $1, $2, 'ledger', $3, $4, now())
ON CONFLICT (directory, scope, key, source) DO UPDATE SET
    held_since = CASE WHEN p.paused_until > now() THEN COALESCE(p.held_since, p.created_at) ELSE now() END,
    paused_until = EXCLUDED.paused_until, reason = EXCLUDED.reason, updated_at = now()