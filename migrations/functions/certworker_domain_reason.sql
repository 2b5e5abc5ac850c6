-- certworker_domain_reason(p_ssl_error): the stable reason code of what a domain's
-- ssl_error says, from the prefix the worker writes it with (docs/domain-status.md
-- lists the codes). NULL for NULL. An error with no prefix of its own is what the CA
-- said of the name when it failed to validate it: validation_failed. A domain given up
-- at --max-attempts keeps its last error, followed by "(given up: ...)":
-- too_many_failures. A wait for DNS that can end only by a CNAME (a wildcard, whose
-- message asks for nothing else) is cname_missing.
CREATE OR REPLACE FUNCTION public.certworker_domain_reason(p_ssl_error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER AS $fn$
    SELECT CASE
        WHEN p_ssl_error IS NULL THEN NULL
        WHEN p_ssl_error LIKE '%(given up: % attempts, at or above --max-attempts %' THEN 'too_many_failures'
        WHEN p_ssl_error LIKE 'waiting for DNS: %' THEN
            CASE WHEN p_ssl_error ~ '; to be issued, set [^;]*$' THEN 'cname_missing' ELSE 'dns_not_pointed' END
        WHEN p_ssl_error LIKE 'invalid domain: %' THEN 'invalid_name'
        WHEN p_ssl_error LIKE 'duplicate domain: %' THEN 'duplicate'
        WHEN p_ssl_error LIKE 'caa: %' THEN 'caa_forbids'
        WHEN p_ssl_error LIKE 'profile: %' THEN 'profile_unavailable'
        WHEN p_ssl_error LIKE 'preflight: %' THEN 'preflight_failed'
        WHEN p_ssl_error LIKE 'issuance was interrupted%' THEN 'interrupted'
        ELSE 'validation_failed'
    END
$fn$;

COMMENT ON FUNCTION public.certworker_domain_reason(text) IS
    'The stable reason code (docs/domain-status.md) of a domain''s ssl_error; NULL for NULL.';
