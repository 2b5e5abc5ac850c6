SELECT ssl_status, count(*) FROM proxy_domains
WHERE ssl_provider = 'acme' AND ($1::uuid IS NULL OR tenant_id = $1::uuid) GROUP BY 1