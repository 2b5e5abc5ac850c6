
SELECT now(), due.n, due.earliest, done.n
FROM (SELECT count(*)::int AS n, min(c.expires_at) AS earliest
      FROM proxy_certificates c JOIN proxy_domains d ON d.domain = c.domain
      WHERE c.ari_window_start IS NOT NULL AND c.ari_window_start <= now()
        AND c.expires_at > now() AND c.auto_renew
        AND d.verification_status = 'verified' AND d.ssl_provider = 'acme') due,
     (SELECT count(*)::int AS n FROM certworker_ledger l
      WHERE l.directory = ANY (COALESCE($1::text[], (SELECT array_agg(DISTINCT directory) FROM certworker_acme_accounts)))
        AND l.at > now() - make_interval(secs => $2) AND l.renewal AND l.outcome = 'issued') done