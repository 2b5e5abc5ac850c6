
SELECT c.id::text, c.domain, c.certificate_pem, COALESCE(d.id::text, ''), COALESCE(d.tenant_id::text, '')
FROM proxy_certificates c LEFT JOIN proxy_domains d ON d.domain = c.domain
WHERE c.renew_at IS NULL AND c.auto_renew AND c.id > $1::uuid
ORDER BY c.id LIMIT $2