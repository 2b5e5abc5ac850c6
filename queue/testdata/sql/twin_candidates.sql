
WITH twice AS MATERIALIZED (
    SELECT lower(t.domain) AS name FROM proxy_domains t
    WHERE t.verification_status = 'verified' AND t.ssl_provider = 'acme'
    GROUP BY lower(t.domain) HAVING count(*) > 1
)
SELECT a.id::text FROM proxy_domains a
WHERE a.verification_status = 'verified' AND a.ssl_provider = 'acme' AND lower(a.domain) IN (SELECT name FROM twice)
UNION
SELECT a.id::text FROM proxy_domains a
WHERE a.verification_status = 'verified' AND a.ssl_provider = 'acme' AND a.ssl_status = 'failed' AND a.ssl_error LIKE 'duplicate domain: %'