
WITH old AS (SELECT retry_base_seconds, retry_max_seconds, max_attempts, limits FROM certworker_settings WHERE id)
INSERT INTO certworker_settings (id, retry_base_seconds, retry_max_seconds, max_attempts, limits, updated_at)
VALUES (true, $1, $2, $3, $4, now())
ON CONFLICT (id) DO UPDATE SET
    retry_base_seconds = EXCLUDED.retry_base_seconds, retry_max_seconds = EXCLUDED.retry_max_seconds,
    max_attempts = EXCLUDED.max_attempts, limits = EXCLUDED.limits, updated_at = EXCLUDED.updated_at
RETURNING (SELECT retry_base_seconds FROM old), (SELECT retry_max_seconds FROM old),
    (SELECT max_attempts FROM old), (SELECT limits FROM old)