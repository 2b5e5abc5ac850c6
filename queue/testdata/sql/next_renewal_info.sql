
SELECT (EXTRACT(epoch FROM ((SELECT min(ari_next_at) FROM proxy_certificates WHERE ari_next_at IS NOT NULL))) - EXTRACT(epoch FROM clock_timestamp()))::float8