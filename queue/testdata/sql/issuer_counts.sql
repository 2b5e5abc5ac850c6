
SELECT COALESCE(c.issuer_directory, ''), count(*)
FROM proxy_certificates c JOIN proxy_domains d ON d.domain = c.domain AND d.ssl_provider = 'acme'
GROUP BY 1 ORDER BY 2 DESC, 1