
WITH stale AS (
    SELECT ctid FROM certworker_ledger
    WHERE directory = $1 AND outcome = 'pending' AND at < now() - make_interval(secs => $2)
    LIMIT $3
    FOR UPDATE SKIP LOCKED)
UPDATE certworker_ledger l SET outcome = 'unknown'
FROM stale WHERE l.ctid = stale.ctid