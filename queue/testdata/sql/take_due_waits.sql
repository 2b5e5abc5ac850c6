
WITH due AS (
    SELECT s.domain_id, d.tenant_id, d.domain, s.next_check_at,
           row_number() OVER (PARTITION BY d.tenant_id ORDER BY s.next_check_at, s.domain_id) AS rank
    FROM certworker_dns_state s JOIN proxy_domains d ON d.id = s.domain_id
    WHERE s.next_check_at <= now()
), busy AS (
    SELECT b.tenant_id, b.running FROM unnest($5::uuid[], $6::int[]) AS b(tenant_id, running)
), picked AS (
    SELECT due.domain_id, due.tenant_id, due.domain
    FROM due LEFT JOIN busy ON busy.tenant_id = due.tenant_id
    WHERE $4 <= 0 OR due.rank <= $4 - COALESCE(busy.running, 0)
    ORDER BY due.rank, due.next_check_at, due.domain_id
    LIMIT $1
), locked AS (
    SELECT s.domain_id FROM certworker_dns_state s
    WHERE s.domain_id IN (SELECT domain_id FROM picked) AND s.next_check_at <= now()
    FOR UPDATE SKIP LOCKED
)
UPDATE certworker_dns_state s
SET next_check_at = now() + make_interval(secs => $2), taken_until = now() + make_interval(secs => $2)
FROM picked
WHERE s.domain_id = picked.domain_id AND s.domain_id IN (SELECT domain_id FROM locked)
RETURNING s.domain_id::text, picked.tenant_id::text, picked.domain, COALESCE(s.waiting_since, now()),
    COALESCE(s.paced_since, s.waiting_since, now()), COALESCE(s.answer, ''),
    (SELECT count(*) FROM certworker_dns_state x
     WHERE x.next_check_at IS NOT NULL AND COALESCE(x.paced_since, x.waiting_since) < now() - make_interval(secs => $3))::int