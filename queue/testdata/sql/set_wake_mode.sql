
WITH old AS (SELECT wake FROM certworker_settings WHERE id)
INSERT INTO certworker_settings (id, wake, updated_at) VALUES (true, $1, now())
ON CONFLICT (id) DO UPDATE SET wake = EXCLUDED.wake, updated_at = EXCLUDED.updated_at
RETURNING (SELECT wake FROM old)