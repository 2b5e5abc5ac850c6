
DELETE FROM certworker_ledger WHERE directory = $1 AND claim_token = $2
RETURNING outcome IN ('pending', 'unknown')