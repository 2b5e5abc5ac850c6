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

// unleasedGrace is how long a 'provisioning' row without a lease is left alone after
// its last attempt before it is reclaimed: the reference worker's own STUCK_AFTER.
// Such a row is the reference's claim (or a hand edit), and while the two workers run
// side by side during a cutover the reference may still be ordering it: its orders
// are bounded by its own 15 minutes, not by anything certworker can see. Taking it
// back sooner (this was 2 minutes) orders the same domain twice. A claim of
// certworker's own has a lease, and is reclaimed as soon as the lease runs out.
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

// ReclaimAbandoned puts back domains whose claim was abandoned: 'provisioning' with a
// lease that ran out (the instance holding it died), or, for a row claimed without a
// lease (by the reference worker or by hand), last tried more than unleasedGrace
// (15 minutes) ago. Without it, nothing ever moves such a row out of 'provisioning' and the domain
// silently never gets a certificate.
//
// The attempt is counted: the interrupted order was still an order, and an instance
// that crash-loops during issuance would otherwise retry without limit and spend the
// CA's rate limit on a problem that is not the CA's. At the limit the domain fails,
// as any other failure does (the reference left it 'pending' at the limit, where
// nothing would ever claim it and status would not show it as failed).
//
// The backoff is not applied (ssl_last_attempt_at is cleared): the failure was this
// service's, not the domain's, and a domain whose certworker claim was abandoned
// is claimable again within 2 minutes of it, while the backoff after
// one attempt is twice --retry-base.
//
// A live order is never taken: its instance renews the lease every third of it. A
// lease later than a whole lease from now counts as run out (leaseEndSQL).
//
// Rows another transaction holds locked (the proxy's open write to one of them, as a
// slow request makes) are passed over, not waited for (SKIP LOCKED): one such lock
// made the one statement give up (55P03) and take every other abandoned row back
// with it, and a killed instance's claims stayed 'provisioning' past those 2
// minutes. A row passed over is reclaimed by a later run. fillBatch
// rows a statement, so that no statement holds many rows' locks.
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
