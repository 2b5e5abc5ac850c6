
SELECT scope, key, source, paused_until, reason, directory FROM certworker_pauses
WHERE paused_until > now() ORDER BY paused_until DESC