
SELECT now(), count(*) FILTER (WHERE ssl_status = 'active'), count(*) FILTER (WHERE verification_status = 'verified')
FROM proxy_domains
WHERE ssl_provider = 'acme'