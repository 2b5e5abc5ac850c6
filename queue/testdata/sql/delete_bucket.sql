
DELETE FROM certworker_buckets WHERE directory = $1 AND kind = $2 AND key = $3