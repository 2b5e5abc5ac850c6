
SELECT retry_base_seconds, retry_max_seconds, max_attempts, limits FROM certworker_settings WHERE id