
WITH taken AS (
    INSERT INTO certworker_fleet_duties AS f (duty, holder, expires_at)
    VALUES ($1, $2, now() + make_interval(secs => $3))
    ON CONFLICT (duty) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
        WHERE f.holder = EXCLUDED.holder OR f.expires_at <= now()
    RETURNING holder, expires_at
)
SELECT holder, extract(epoch FROM expires_at - now())::float8 FROM taken
UNION ALL
SELECT holder, extract(epoch FROM expires_at - now())::float8 FROM certworker_fleet_duties
WHERE duty = $1 AND NOT EXISTS (SELECT 1 FROM taken)