
DELETE FROM certworker_pauses WHERE scope = 'ca' AND key = $1 AND source = 'unreachable'