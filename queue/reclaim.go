package queue

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Reclaimed is a domain requeued because its claim was abandoned.
type Reclaimed struct {
	ID       string
	TenantID string
	Domain   string
	Attempts int
	GaveUp   bool
}

// interruptedError is the ssl_error of a reclaimed domain.
const interruptedError = "issuance was interrupted before it finished"

// unleasedGrace is how long a 'provisioning' row without a lease (claimed by the
// Rust worker or by hand) is left after its last attempt: the Rust worker's own
// bound on its orders, which may still run during a cutover.
const unleasedGrace = 15 * time.Minute

var reclaimAbandonedSQL = `
WITH abandoned AS (
    SELECT id FROM proxy_domains
    WHERE ssl_status = 'provisioning'
      AND ssl_provider = 'acme'
      AND COALESCE(` + leaseEndSQL("proxy_domains", "$5") + `,
                   COALESCE(ssl_last_attempt_at, updated_at) + make_interval(secs => $2)) < now()
    LIMIT $4
    FOR UPDATE SKIP LOCKED)
UPDATE proxy_domains d SET
    ssl_status = CASE WHEN ` + nextAttemptSQL + ` >= $1 THEN 'failed' ELSE 'pending' END,
    ssl_attempts = ` + nextAttemptSQL + `,
    ssl_error = $3,
    ssl_last_attempt_at = NULL,
    updated_at = now(), ` + releaseClaimSQL + `
FROM abandoned
WHERE d.id = abandoned.id
RETURNING d.id::text, d.tenant_id::text, d.domain, d.ssl_attempts, d.ssl_status = 'failed',
    ` + eventSQL("d", "'failed'", "'interrupted'", "d.ssl_error")

// ReclaimAbandoned puts back domains whose claim was abandoned: a lease that ran out
// (leaseEndSQL), or, without a lease, a last attempt older than unleasedGrace. The
// attempt is counted, so a crash-looping instance cannot spend the CA's limit without
// end; the backoff is not (the failure was ours). Locked rows are passed over (SKIP
// LOCKED), so one lock cannot fail the statement; fillBatch rows a statement.
func (q *Queue) ReclaimAbandoned(ctx context.Context) ([]Reclaimed, error) {
	reason := q.errorText(ctx, interruptedError)
	var out []Reclaimed
	for {
		rows, err := q.db.Query(ctx, reclaimAbandonedSQL,
			q.cfg.MaxAttempts, seconds(unleasedGrace), reason, fillBatch, seconds(q.cfg.Lease))
		if err != nil {
			return out, fmt.Errorf("reclaim abandoned: %w", err)
		}
		batch, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Reclaimed, error) {
			var x Reclaimed
			err := r.Scan(&x.ID, &x.TenantID, &x.Domain, &x.Attempts, &x.GaveUp, new(int64))
			return x, err
		})
		out = append(out, batch...)
		if err != nil {
			return out, fmt.Errorf("reclaim abandoned: %w", err)
		}
		if len(batch) < fillBatch {
			return out, nil
		}
	}
}
