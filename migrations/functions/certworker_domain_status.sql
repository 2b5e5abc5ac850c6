-- certworker_domain_status(p_domain_id, p_tenant_id): a domain's state as the proxy
-- shows it to its tenant (docs/domain-status.md has the states and reason codes).
-- One row; none for another tenant's domain or an unknown id (the tenant rule of the
-- tenant operations).
--
-- state, in order: not_managed (not verified, or not acme), failed, issued (active),
-- issuing or renewing (provisioning, without or with a stored certificate),
-- waiting_for_dns (its ssl_error is a wait's), waiting_for_ca (a pause holds it: the
-- CA's rate limit, the ledger of its limits, the CA unreachable), renewing (pending
-- with a certificate stored), queued.
--
-- reason: NULL when nothing is wrong. A pause's is rate_limited (the CA's limit, or
-- the ledger that keeps orders within it) or ca_unavailable; a failed domain at
-- --max-attempts is too_many_failures; otherwise certworker_domain_reason of its
-- ssl_error, for a domain failed, waiting, retrying (attempts behind it), or issued
-- under its certificate's profile because the CA does not offer its own.
--
-- message: ssl_error as the worker stored it (sanitised, never naming another
-- tenant's row); a pause's own text is not shown (a CA's rate-limit detail may name
-- another tenant's domain), only which pause it is.
--
-- next_check_at: a wait's next DNS check; a pause's end (for the ledger, the next
-- token); a retry's backoff end, by the fleet's recorded --retry-base and --retry-max;
-- now for a queued domain; the certificate's renewal time for an issued one; NULL when
-- nothing is scheduled (failed, being issued, not managed).
--
-- point_to: --dns-target as recorded in certworker_settings, '' when none;
-- cname_target: certworker_dns01_target's, computed here from the settings row this
-- reads anyway (that function is not inlined: a call of it is planned anew each time,
-- most of this function's time; a test holds the two together), NULL when DNS-01 is
-- off; challenge: the one last chosen
-- (certworker_dns_state); expires_at and renew_at: the stored certificate's.
--
-- LANGUAGE sql, STABLE, SECURITY INVOKER, without SET, names qualified: it runs with
-- the proxy's rights (SELECT on the tables it reads, deploy/grants.sql).
CREATE OR REPLACE FUNCTION public.certworker_domain_status(p_domain_id uuid, p_tenant_id uuid)
RETURNS TABLE (domain_id uuid, domain text, state text, reason text, message text,
               next_check_at timestamptz, point_to text, cname_target text, challenge text,
               expires_at timestamptz, renew_at timestamptz)
LANGUAGE sql STABLE SECURITY INVOKER AS $fn$
    SELECT x.id, x.domain, x.state,
        CASE x.state
            WHEN 'waiting_for_ca' THEN CASE x.pause_source WHEN 'unreachable' THEN 'ca_unavailable' ELSE 'rate_limited' END
            WHEN 'failed' THEN
                CASE WHEN x.ssl_attempts >= x.max_attempts
                          AND COALESCE(public.certworker_domain_reason(x.ssl_error), 'validation_failed') = 'validation_failed'
                     THEN 'too_many_failures'
                     ELSE COALESCE(public.certworker_domain_reason(x.ssl_error), 'validation_failed') END
            WHEN 'waiting_for_dns' THEN public.certworker_domain_reason(x.ssl_error)
            WHEN 'queued' THEN CASE WHEN x.ssl_attempts > 0 THEN public.certworker_domain_reason(x.ssl_error) END
            WHEN 'renewing' THEN CASE WHEN x.ssl_attempts > 0 THEN public.certworker_domain_reason(x.ssl_error) END
            WHEN 'issued' THEN CASE WHEN x.ssl_error LIKE 'profile: %' THEN 'profile_unavailable' END
        END,
        CASE x.state
            WHEN 'waiting_for_ca' THEN CASE x.pause_source
                WHEN 'unreachable' THEN 'held back: the CA cannot be reached; ordering resumes when it answers'
                WHEN 'ledger' THEN 'held back: the CA''s limits on orders are used up until the next one is allowed'
                ELSE 'held back: the CA''s rate limit' END
            WHEN 'not_managed' THEN CASE WHEN x.ssl_provider <> 'acme' THEN 'its certificate does not come from ACME'
                                         ELSE 'not verified' END
            ELSE x.ssl_error
        END,
        CASE x.state
            WHEN 'waiting_for_dns' THEN x.dns_next_check_at
            WHEN 'waiting_for_ca' THEN x.paused_until
            WHEN 'issued' THEN x.renew_at
            WHEN 'queued' THEN x.backoff_end
            WHEN 'renewing' THEN CASE WHEN x.ssl_status = 'pending' THEN x.backoff_end END
        END,
        x.point_to,
        CASE WHEN x.zone IS NOT NULL THEN
            pg_catalog.substr(pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
                x.zone || '/' || pg_catalog.lower(pg_catalog.regexp_replace(x.domain, '^\*\.', '')), 'UTF8')), 'hex'), 1, 32)
            || '.' || x.zone END,
        x.challenge, x.expires_at, x.renew_at
    FROM (
        SELECT d.id, d.domain, d.ssl_status, d.ssl_provider, d.ssl_attempts, d.ssl_error,
            CASE
                WHEN d.ssl_provider IS DISTINCT FROM 'acme' OR d.verification_status IS DISTINCT FROM 'verified' THEN 'not_managed'
                WHEN d.ssl_status = 'failed' THEN 'failed'
                WHEN d.ssl_status = 'active' THEN 'issued'
                WHEN d.ssl_status = 'provisioning' THEN CASE WHEN c.domain IS NULL THEN 'issuing' ELSE 'renewing' END
                WHEN d.ssl_error LIKE 'waiting for DNS: %' THEN 'waiting_for_dns'
                WHEN pz.source IS NOT NULL THEN 'waiting_for_ca'
                WHEN c.domain IS NOT NULL THEN 'renewing'
                ELSE 'queued'
            END AS state,
            pz.source AS pause_source, pz.paused_until,
            COALESCE(s.max_attempts, 10) AS max_attempts,
            GREATEST(pg_catalog.now(), d.ssl_last_attempt_at + pg_catalog.make_interval(secs => CASE WHEN d.ssl_attempts > 0 THEN
                LEAST(COALESCE(s.retry_base_seconds, 60) * pg_catalog.power(2, LEAST(d.ssl_attempts, 62)),
                      COALESCE(s.retry_max_seconds, 14400)) ELSE 0 END)) AS backoff_end,
            ds.next_check_at AS dns_next_check_at, ds.challenge,
            COALESCE(s.dns_target, '') AS point_to, c.expires_at, c.renew_at,
            pg_catalog.lower(pg_catalog.rtrim(NULLIF(s.dns01_zone, ''), '.')) AS zone
        FROM public.proxy_domains d
        LEFT JOIN public.proxy_certificates c ON c.domain = d.domain
        LEFT JOIN public.certworker_dns_state ds ON ds.domain_id = d.id
        LEFT JOIN public.certworker_settings s ON s.id
        LEFT JOIN LATERAL (
            SELECT p.source, p.paused_until FROM public.certworker_pauses p
            WHERE p.paused_until > pg_catalog.now()
              AND (p.scope = 'ca'
                   OR (p.scope = 'tenant' AND p.key = d.tenant_id::text)
                   OR (p.scope IN ('registered_domain', 'domain')
                       AND p.key = ANY (public.certworker_suffixes(d.domain))
                       AND (p.scope = 'registered_domain' OR p.key = pg_catalog.lower(d.domain))))
            ORDER BY p.paused_until DESC LIMIT 1) pz ON d.ssl_status = 'pending'
        WHERE d.id = p_domain_id AND d.tenant_id = p_tenant_id
    ) x
$fn$;

COMMENT ON FUNCTION public.certworker_domain_status(uuid, uuid) IS
    'A domain''s state, reason code, message and next check, for its tenant (docs/domain-status.md); no row for another tenant''s domain. SECURITY INVOKER: the caller needs SELECT on the tables it reads.';
