
INSERT INTO certworker_ari_buckets AS b (directory, tokens, refilled_at, granted)
VALUES ($1, $4::float8 - LEAST($2::int, floor($4::float8)), clock_timestamp(), LEAST($2::int, floor($4::float8)))
ON CONFLICT (directory) DO UPDATE SET (granted, tokens, refilled_at) = (
    SELECT g, avail - g, at FROM (
        SELECT LEAST($2::int, floor(avail))::int AS g, avail, at FROM (
            SELECT LEAST($4::float8, b.tokens + $3::float8 * GREATEST(0, EXTRACT(epoch FROM t.at - b.refilled_at)::float8)) AS avail,
                   GREATEST(b.refilled_at, t.at) AS at
            FROM (SELECT clock_timestamp() AS at) t) a) g)
RETURNING b.granted, b.tokens