-- The tenant's "certificate profile" setting, following certworker_update_domain. One
-- row, the domain as it now is, when it was set; no row, and nothing changed, when it
-- is refused: another tenant's domain, or a value that is not a profile name. A name
-- is 1 to 64 characters, ASCII letters, digits, '.', '_' and '-', starting with a
-- letter or digit (Let's Encrypt's are classic, tlsserver, shortlived): the tenant
-- controls it, and it goes into orders, logs and ssl_error. The empty string is
-- refused rather than read as "the CA's default": NULL puts the domain back on the
-- worker's --acme-profile, and which default that is belongs to the operator.
--
-- Whether the CA offers the profile is not checked here (the database does not know
-- the CA); the worker checks before it orders, and says so in ssl_error. Setting it
-- clears what the worker recorded of a refused profile: a domain that failed because
-- the CA does not offer its profile is queued again, and an active one loses the note
-- in ssl_error. An active, verified acme domain whose certificate was issued under
-- another profile is queued at once to replace it (the worker orders it naming the
-- certificate in "replaces", and the domain keeps its certificate meanwhile); one whose
-- certificate has no recorded profile keeps it, and renews under the new profile when
-- it is due, as does every domain set back to NULL (--acme-profile applies at each
-- renewal). A domain queued is pending with its history cleared, as
-- certworker_queue_for_issuance leaves it, and the wake trigger wakes the workers. The
-- replacement rule is queue.RequeueProfileChanges's too, which the workers run now and
-- then for a profile written without this function, or set while an order was running;
-- the two have to agree.
--
-- Any state is accepted (not verified, provisioning, another provider): the setting
-- is the tenant's, and applies to the next order. The caller needs SELECT on
-- proxy_certificates besides SELECT and UPDATE on proxy_domains.
CREATE OR REPLACE FUNCTION certworker_set_profile(p_domain_id uuid, p_tenant_id uuid, p_profile text)
RETURNS SETOF proxy_domains
LANGUAGE sql SECURITY INVOKER AS $$
    WITH d AS (
        SELECT d.id,
            (d.ssl_profile_refused IS NOT NULL AND d.ssl_status = 'failed' AND d.ssl_provider = 'acme')
            OR (d.ssl_status = 'active' AND d.ssl_provider = 'acme' AND d.verification_status = 'verified'
                AND EXISTS (SELECT 1 FROM public.proxy_certificates c
                            WHERE c.domain = d.domain AND c.auto_renew
                              AND c.profile IS NOT NULL AND c.profile <> p_profile)) AS queue
        FROM public.proxy_domains d
        WHERE d.id = p_domain_id AND d.tenant_id = p_tenant_id
          AND (p_profile IS NULL OR p_profile ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$')
        FOR UPDATE OF d
    )
    UPDATE public.proxy_domains x SET
        ssl_profile = p_profile,
        ssl_profile_refused = NULL,
        ssl_status = CASE WHEN d.queue THEN 'pending' ELSE x.ssl_status END,
        ssl_attempts = CASE WHEN d.queue THEN 0 ELSE x.ssl_attempts END,
        ssl_last_attempt_at = CASE WHEN d.queue THEN NULL ELSE x.ssl_last_attempt_at END,
        ssl_error = CASE WHEN x.ssl_profile_refused IS NOT NULL AND x.ssl_status IN ('failed', 'active')
                         THEN NULL ELSE x.ssl_error END,
        updated_at = now()
    FROM d
    WHERE x.id = d.id
    RETURNING x.*
$$;
COMMENT ON FUNCTION certworker_set_profile(uuid, uuid, text) IS
    'SECURITY INVOKER on purpose: runs with the rights of the caller (the proxy''s role), which must hold SELECT and UPDATE on proxy_domains. Never make it SECURITY DEFINER (migrations/embed.go).';
