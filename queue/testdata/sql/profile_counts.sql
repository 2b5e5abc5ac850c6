
SELECT ssl_profile, count(*), count(*) FILTER (WHERE ssl_profile = ssl_profile_refused)
FROM proxy_domains WHERE ssl_profile IS NOT NULL AND ssl_provider = 'acme'
GROUP BY 1 ORDER BY 2 DESC, 1