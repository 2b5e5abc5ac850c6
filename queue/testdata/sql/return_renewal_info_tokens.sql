
UPDATE certworker_ari_buckets SET tokens = LEAST($3, tokens + $2) WHERE directory = $1