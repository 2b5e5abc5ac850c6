
INSERT INTO certworker_buckets (directory, kind, key, tat) VALUES ($1, $2, $3, $4)
ON CONFLICT (directory, kind, key) DO UPDATE SET tat = EXCLUDED.tat