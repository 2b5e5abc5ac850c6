
SELECT lim.count,
       (SELECT count(*)::int FROM certworker_ledger l
        WHERE l.directory = $1 AND l.outcome <> 'not_sent'
          AND l.at > now() - make_interval(secs => lim.window_seconds))
FROM certworker_settings s,
     LATERAL (SELECT (s.limits -> 'orders_per_account' ->> 'count')::int AS count,
                     (s.limits -> 'orders_per_account' ->> 'window_seconds')::float8 AS window_seconds) lim
WHERE s.id AND lim.count IS NOT NULL AND lim.window_seconds IS NOT NULL