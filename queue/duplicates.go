package queue

import (
	"context"
	"fmt"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

var markCaseDuplicatesSQL = `
WITH judged AS (
    SELECT d.id, ` + keepsNameSQL("d") + ` AS keeps
    FROM proxy_domains d
    WHERE d.id = ANY ($1::uuid[]) AND ` + twinCountsSQL("d") + `
    FOR UPDATE OF d SKIP LOCKED
), lost AS (
    ` + failTwinsSQL("judged j", "j.id", "NOT j.keeps AND (d.ssl_status <> 'failed' OR d.ssl_error IS DISTINCT FROM '"+duplicateReason+"')",
	"d.id, d.tenant_id, d.domain, d.ssl_error, false AS back") + `
), back AS (
    UPDATE proxy_domains d SET
        ssl_status = 'pending', ssl_attempts = 0, ssl_error = NULL, ssl_last_attempt_at = NULL, updated_at = now()
    FROM judged j
    WHERE d.id = j.id AND j.keeps AND d.ssl_status = 'failed' AND d.ssl_error LIKE '` + duplicateError + `%'
    RETURNING d.id, d.tenant_id, d.domain, 'the name is its own again: back in the queue' AS ssl_error, true AS back,
        ` + eventSQL("d", "'queued'", "NULL", "'the name is its own again: back in the queue'") + ` AS event_id
)
SELECT id::text, tenant_id::text, domain, ssl_error, back FROM lost
UNION ALL
SELECT id::text, tenant_id::text, domain, ssl_error, back FROM back`

// MarkCaseDuplicates applies the case twins' rule (twins.go) to the rows the claim
// does not read: it fails every verified acme domain a twin keeps the name from, and
// requeues every duplicate that keeps its name now, returning both. It reads the
// twins' index once, so it belongs on a maintenance timer; marking is a second
// statement by id, since one doing both is planned for a third of the table.
func (q *Queue) MarkCaseDuplicates(ctx context.Context) (marked, restored []issuing.BadRow, err error) {
	rows, err := q.db.Query(ctx, twinCandidatesSQL)
	if err != nil {
		return nil, nil, fmt.Errorf("find case duplicates: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, nil, fmt.Errorf("find case duplicates: %w", err)
	}
	if len(ids) == 0 {
		return nil, nil, nil
	}
	rows, err = q.db.Query(ctx, markCaseDuplicatesSQL, ids)
	if err != nil {
		return nil, nil, fmt.Errorf("mark case duplicates: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var b issuing.BadRow
		var back bool
		if err := rows.Scan(&b.ID, &b.TenantID, &b.Domain, &b.Reason, &back); err != nil {
			return nil, nil, fmt.Errorf("mark case duplicates: %w", err)
		}
		if back {
			restored = append(restored, b)
		} else {
			marked = append(marked, b)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("mark case duplicates: %w", err)
	}
	return marked, restored, nil
}

// twinCandidatesSQL returns the ids MarkCaseDuplicates judges: the verified acme rows
// of names held twice, and the rows failed as duplicates (proxy_domains_twins_idx).
var twinCandidatesSQL = `
WITH twice AS MATERIALIZED (
    SELECT lower(t.domain) AS name FROM proxy_domains t
    WHERE ` + twinCountsSQL("t") + `
    GROUP BY lower(t.domain) HAVING count(*) > 1
)
SELECT a.id::text FROM proxy_domains a
WHERE ` + twinCountsSQL("a") + ` AND lower(a.domain) IN (SELECT name FROM twice)
UNION
SELECT a.id::text FROM proxy_domains a
WHERE ` + twinCountsSQL("a") + ` AND a.ssl_status = 'failed' AND a.ssl_error LIKE '` + duplicateError + `%'`
