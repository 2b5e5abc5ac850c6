
SELECT scope, key, source, paused_until, reason, directory FROM certworker_pauses
WHERE scope = 'ca' AND key = $1 AND paused_until > now()
ORDER BY paused_until DESC LIMIT 1