
INSERT INTO certworker_settings (id, dns01_zone, updated_at) VALUES (true, $1, now())
ON CONFLICT (id) DO UPDATE SET dns01_zone = EXCLUDED.dns01_zone, updated_at = EXCLUDED.updated_at
WHERE certworker_settings.dns01_zone IS DISTINCT FROM EXCLUDED.dns01_zone