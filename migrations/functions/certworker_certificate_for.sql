-- certworker_certificate_for(p_name): the certificate to serve for a TLS server name,
-- the one statement of the serving rule that every reader uses (package certstore
-- included): no row when nothing is to be served, otherwise one row.
--
-- The name is compared in lower case, without a trailing dot. Its own domain rows
-- are looked at first, then the wildcard one label above it (www.shop.example:
-- *.shop.example, never *.example, whose base would be one label), and only verified
-- rows count:
--   - a name with a verified row of its own, whatever its tenant, is served that
--     row's certificate or none, never the wildcard's; an unverified row of its own
--     holds nothing back (verification is what makes a name a tenant's);
--   - of two verified rows differing only in case (case twins), an acme row comes
--     first, and of acme rows the one that keeps the name: the one holding a
--     certificate, then the one that became verified and acme first
--     (ssl_eligible_at; none comes last), then the smaller id. The claim keeps the
--     name for the same row and fails the other;
--   - with no verified acme row, two verified rows (two uploads, say) are not served:
--     either could be another tenant's.
-- Whatever the row's ssl_status and ssl_provider: a renewal under way or failed, a
-- certificate uploaded by hand. Whether the certificate is valid now and covers the
-- name is the reader's to check, as is opening the key.
--
-- Columns: domain is the certificate row's name in lower case (*.base for a
-- wildcard), which a sealed key is bound to as its associated data; private_key_pem
-- is as stored, PEM or sealed; version is the row's version, which the certificate
-- triggers draw from one sequence on every write of the certificate, its key or its
-- name, 0 for a row nobody has written since versions began. A different version, or
-- a different domain, is a different certificate.
--
-- LANGUAGE sql, STABLE, SECURITY INVOKER, not STRICT and without SET: so the planner
-- inlines it into the caller's query, and each look-up is a probe of
-- proxy_domains_lower_domain_idx, planned with the statement (a proxy's prepared
-- statement too). It runs with the caller's rights: SELECT on both tables' columns
-- it reads (the proxy's role holds them; certworker's workers may not read keys).
CREATE OR REPLACE FUNCTION public.certworker_certificate_for(p_name text)
RETURNS TABLE (domain text, certificate_pem text, private_key_pem text, expires_at timestamptz, version bigint)
LANGUAGE sql STABLE PARALLEL SAFE SECURITY INVOKER AS $fn$
    SELECT pg_catalog.lower(pick.cert_domain), pick.certificate_pem, pick.private_key_pem,
           pick.expires_at, pick.version
    FROM (
        SELECT cand.*
        FROM (SELECT n, pg_catalog.substr(n, pg_catalog.strpos(n, '.') + 1)
              FROM (SELECT pg_catalog.regexp_replace(pg_catalog.lower(p_name), '\.$', '')) AS asked(n)
             ) AS q(name, parent)
        CROSS JOIN LATERAL (VALUES (1, q.name),
                                   (2, CASE WHEN pg_catalog.strpos(q.parent, '.') > 0 THEN '*.' || q.parent END)
                           ) AS step(n, name)
        CROSS JOIN LATERAL (
            SELECT d.ssl_provider = 'acme' AS acme, pg_catalog.count(*) OVER () AS verified_rows,
                   c.domain AS cert_domain, c.certificate_pem, c.private_key_pem, c.expires_at,
                   COALESCE(c.version, 0) AS version
            FROM public.proxy_domains d
            LEFT JOIN public.proxy_certificates c ON c.domain = d.domain
            WHERE pg_catalog.lower(d.domain) = step.name AND d.verification_status = 'verified'
            ORDER BY d.ssl_provider = 'acme' DESC, c.domain IS NULL,
                     COALESCE(d.ssl_eligible_at, 'infinity'::timestamptz), d.id
            LIMIT 1
        ) AS cand
        ORDER BY step.n
        LIMIT 1
    ) AS pick
    WHERE pick.cert_domain IS NOT NULL AND (pick.acme OR pick.verified_rows = 1)
$fn$;

COMMENT ON FUNCTION public.certworker_certificate_for(text) IS
    'The certificate to serve for a TLS server name (case and a trailing dot ignored), by the case-twin and wildcard rules; no row when none is. SECURITY INVOKER on purpose: the caller needs SELECT on proxy_domains and proxy_certificates. Never make it SECURITY DEFINER (migrations/embed.go).';
