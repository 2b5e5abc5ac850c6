
WITH c AS (
    UPDATE proxy_certificates SET
        renew_at = CASE WHEN $7 THEN LEAST(renew_at, now()) ELSE LEAST(renew_at, $2) END,
        ari_window_start = CASE WHEN $3::timestamptz IS NULL THEN ari_window_start ELSE $8 END,
        ari_window_end = COALESCE($3, ari_window_end),
        ari_next_at = now() + make_interval(secs => $4)
    WHERE id = $1 AND serial IS NOT DISTINCT FROM $5 AND version IS NOT DISTINCT FROM $6
    RETURNING domain, renew_at, ari_window_end
), d AS (
    UPDATE proxy_domains d SET ssl_renew_by = c.ari_window_end
    FROM c
    WHERE d.domain = c.domain AND c.ari_window_end IS NOT NULL
      AND (d.ssl_renew_by IS NULL OR c.ari_window_end < d.ssl_renew_by)
)
SELECT (EXTRACT(epoch FROM (renew_at)) - EXTRACT(epoch FROM clock_timestamp()))::float8 FROM c