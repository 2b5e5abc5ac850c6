package queue

import (
	"context"
	"fmt"
)

// recordWithdrawalsSQL takes up to $1 rows the proxy took out of certworker's hands
// (ssl_withdrawn_at, stamped by the trigger certworker_eligible_since when a row left
// verified and acme), clears the stamp, and records the withdrawn event at the
// stamp's time in the same statement. A domain with no history was never
// certworker's, and one whose newest event is later than the stamp (verified again
// and claimed before this ran) has its history past the withdrawal already: neither
// is recorded. Rows the proxy holds locked are left for the next run.
var recordWithdrawalsSQL = `
WITH taken AS (
    SELECT d.id, d.tenant_id, d.ssl_withdrawn_at AS at FROM proxy_domains d
    WHERE d.ssl_withdrawn_at IS NOT NULL
    ORDER BY d.ssl_withdrawn_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), cleared AS (
    UPDATE proxy_domains d SET ssl_withdrawn_at = NULL
    FROM taken WHERE d.id = taken.id
    RETURNING taken.id, taken.tenant_id, taken.at
)
SELECT count(*), count(CASE
    WHEN c.at >= (SELECT e.last_at FROM certworker_domain_events e WHERE e.domain_id = c.id ORDER BY e.id DESC LIMIT 1)
    THEN certworker_domain_event(c.id, c.tenant_id, 'withdrawn', NULL, NULL, c.at) END)
FROM cleared c`

// RecordWithdrawals records the withdrawn event of each domain the proxy took out of
// certworker's hands since the last run (docs/domain-status.md, "Events"), at the
// time it did, fillBatch rows a statement, and returns how many it recorded.
func (q *Queue) RecordWithdrawals(ctx context.Context) (int64, error) {
	var recorded int64
	for {
		var taken, n int64
		if err := q.db.QueryRow(ctx, recordWithdrawalsSQL, fillBatch).Scan(&taken, &n); err != nil {
			return recorded, fmt.Errorf("record withdrawn domains: %w", err)
		}
		recorded += n
		if taken < fillBatch {
			return recorded, nil
		}
	}
}
