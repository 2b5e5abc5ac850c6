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
// does not read: it marks 'failed' every verified acme domain that a twin keeps the
// name from (an active one, one in 'provisioning', whose claim is dropped and whose
// result is not stored, one held out of line), and puts back in the queue every
// domain failed as a duplicate that keeps its name now (its twin was deleted,
// unverified or switched from acme, or it was failed by the rule of old, which
// counted every row of the name whatever its state). It returns the rows it marked
// (a row already marked so is not returned again) and those it put back.
//
// Certificates are ordered for the name in lower case, so two rows would order the
// same certificate, twice the CA's rate limit for one name, and each would overwrite
// the other's.
//
// Finding them reads the names of the verified acme rows once, in order, from an
// index (proxy_domains_twins_idx, migration 00025: about 0.2 s at a million domains),
// and then only the rows of the names held twice and the rows failed as duplicates
// (proxy_domains_unsettled_idx), so it belongs on a maintenance timer, not on every
// wake-up. Only twins that count (verified, acme) make a name held twice: a row whose
// only twins do not count keeps its name whatever the judgement, so leaving it out
// changes nothing. Marking them is a second statement, on their ids only: one
// statement doing both is planned for a third of the table and spends longer
// compiling it (JIT) than running it.
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

// twinCandidatesSQL returns the ids MarkCaseDuplicates judges: every verified acme row
// of a name (in lower case) that two or more verified acme rows hold, and every
// verified acme row failed as a duplicate (it may keep its name now). The names held
// twice are a group per name of an index-only scan of proxy_domains_twins_idx, whose
// key is lower(domain) and whose predicate is twinCountsSQL's; the rows are probes of
// the same index by name.
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
