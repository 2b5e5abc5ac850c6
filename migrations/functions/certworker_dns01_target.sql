-- certworker_dns01_target(p_domain): the name the tenant points
-- _acme-challenge.NAME at with a CNAME. The same for NAME and *.NAME (a wildcard is
-- validated at its base's _acme-challenge); stable for a name as long as the zone is;
-- it reveals nothing beyond the name: a hash of the lower-cased base name and the
-- zone, 128 bits in hex, a label under the zone. NULL when DNS-01 is off or for NULL.
-- acme.DNS01Target computes the same in Go, and a test holds the two together.
CREATE OR REPLACE FUNCTION public.certworker_dns01_target(p_domain text) RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = public, pg_temp
AS $fn$
    SELECT substr(pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
               z.zone || '/' || pg_catalog.lower(pg_catalog.regexp_replace(p_domain, '^\*\.', '')), 'UTF8')), 'hex'), 1, 32)
           || '.' || z.zone
    FROM (SELECT pg_catalog.lower(pg_catalog.rtrim(dns01_zone, '.')) AS zone
          FROM public.certworker_settings WHERE id AND dns01_zone IS NOT NULL AND dns01_zone <> '') z
    WHERE p_domain IS NOT NULL
$fn$;

COMMENT ON FUNCTION public.certworker_dns01_target(text) IS
    'The DNS-01 target of a domain: the proxy shows it to the tenant, who points _acme-challenge.NAME at it with a CNAME. NULL when DNS-01 is off.';
