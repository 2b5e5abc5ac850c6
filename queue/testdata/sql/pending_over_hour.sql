
SELECT count(*) FROM proxy_domains
WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending'
  AND COALESCE(ssl_queued_at, updated_at) < now() - make_interval(secs => $1)