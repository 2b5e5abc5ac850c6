-- certworker_name_seen(p_name): the proxy calls it when a TLS handshake finds no
-- certificate for a server name (case and a trailing dot ignored). The handshake is
-- the first sign that the name's DNS has moved to the proxy, often before
-- --preflight-resolver answers with the new address; a domain waiting for its DNS
-- past its first hour is otherwise checked every few minutes or less often.
--
-- For a verified acme domain waiting for its DNS (pending, held 'dns', a check
-- scheduled in certworker_dns_state) it brings the check forward to now, records the
-- handshake (seen_at: the waiter then checks the name every 10 s for 2 minutes, so a
-- handshake that comes before the resolver sees the move is not wasted) and returns
-- true. A check that is running (taken_until ahead) is left to finish: its next one
-- comes 10 s after it. Anything else returns false and writes nothing.
--
-- Proxies call it on every handshake for such a name, so it costs one read through
-- proxy_domains_lower_domain_idx and the state's primary key, and writes at most once
-- a name every 10 s: the first statement writes nothing, and only a name that is
-- waiting and not seen in the last 10 s is written, by an UPDATE that skips a row
-- another session holds (SKIP LOCKED) instead of waiting for it. Of many calls at
-- once for one name, one writes and returns true; the others, and every call for
-- 10 s after, return false without a transaction id.
--
-- The UPDATE runs only under a transaction-scoped advisory lock on the name, taken
-- without waiting: a call that finds it taken returns false. Without it, a call whose
-- UPDATE began just before another's commit re-reads the row's newest version, and
-- PostgreSQL locks that version (a row lock needs a transaction id) before finding
-- that it no longer matches. Under the lock, every earlier writer has committed by
-- the time the UPDATE takes its snapshot, so it sees their seen_at and touches
-- nothing. An advisory lock takes no transaction id.
--
-- SECURITY INVOKER: the proxy's role holds SELECT on the state and UPDATE of seen_at
-- and next_check_at alone (deploy/grants.sql).
CREATE OR REPLACE FUNCTION public.certworker_name_seen(p_name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $fn$
DECLARE
    v_ids uuid[];
BEGIN
    SELECT pg_catalog.array_agg(s.domain_id) INTO v_ids
    FROM public.proxy_domains d
    JOIN public.certworker_dns_state s ON s.domain_id = d.id
    WHERE pg_catalog.lower(d.domain) = pg_catalog.regexp_replace(pg_catalog.lower(p_name), '\.$', '')
      AND d.verification_status = 'verified' AND d.ssl_provider = 'acme'
      AND d.ssl_status = 'pending' AND d.ssl_held = 'dns'
      AND s.next_check_at IS NOT NULL
      AND (s.seen_at IS NULL OR s.seen_at <= pg_catalog.now() - interval '10 seconds');
    IF v_ids IS NULL THEN
        RETURN false;
    END IF;
    IF NOT pg_catalog.pg_try_advisory_xact_lock(
            pg_catalog.hashtext('certworker_name_seen'),
            pg_catalog.hashtext(pg_catalog.regexp_replace(pg_catalog.lower(p_name), '\.$', ''))) THEN
        RETURN false;
    END IF;
    UPDATE public.certworker_dns_state s
    SET seen_at = pg_catalog.now(),
        next_check_at = CASE WHEN s.taken_until > pg_catalog.now() THEN s.next_check_at
                             ELSE LEAST(s.next_check_at, pg_catalog.now()) END
    WHERE s.domain_id IN (SELECT x.domain_id FROM public.certworker_dns_state x
                          WHERE x.domain_id = ANY (v_ids) AND x.next_check_at IS NOT NULL
                            AND (x.seen_at IS NULL OR x.seen_at <= pg_catalog.now() - interval '10 seconds')
                          FOR UPDATE SKIP LOCKED);
    RETURN FOUND;
END
$fn$;

COMMENT ON FUNCTION public.certworker_name_seen(text) IS
    'Called by the proxy when a TLS handshake finds no certificate for a name (case and a trailing dot ignored): brings forward the DNS check of a verified domain waiting for its DNS (true), at most once a name every 10 s; otherwise writes nothing (false). SECURITY INVOKER on purpose: never make it SECURITY DEFINER (migrations/embed.go).';
