package queue

import (
	"context"
	"fmt"
	"time"
)

// Reclaimed is a domain requeued because its claim was abandoned.
type Reclaimed struct {
	ID       string
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
// service's, not the domain's, and CONTRACT.md §5 wants a domain whose certworker
// claim was abandoned claimable again within 2 minutes of it, while the backoff after
// one attempt is twice --retry-base.
//
// A live order is never taken: its instance renews the lease every third of it. A
// lease later than a whole lease from now counts as run out (leaseEndSQL).
func (q *Queue) ReclaimAbandoned(ctx context.Context) ([]Reclaimed, error) {
	rows, err := q.db.Query(ctx, `
UPDATE proxy_domains SET
    ssl_status = CASE WHEN `+nextAttemptSQL+` >= $1 THEN 'failed' ELSE 'pending' END,
    ssl_attempts = `+nextAttemptSQL+`,
    ssl_error = $3,
    ssl_last_attempt_at = NULL,
    updated_at = now(), `+releaseClaimSQL+`
WHERE ssl_status = 'provisioning'
  AND ssl_provider = 'acme'
  AND COALESCE(`+leaseEndSQL("proxy_domains", "$4")+`,
               COALESCE(ssl_last_attempt_at, updated_at) + make_interval(secs => $2)) < now()
RETURNING id::text, domain, ssl_attempts, ssl_status = 'failed'`,
		q.cfg.MaxAttempts, seconds(unleasedGrace), interruptedError, seconds(q.cfg.Lease))
	if err != nil {
		return nil, fmt.Errorf("reclaim abandoned: %w", err)
	}
	defer rows.Close()
	var out []Reclaimed
	for rows.Next() {
		var r Reclaimed
		if err := rows.Scan(&r.ID, &r.Domain, &r.Attempts, &r.GaveUp); err != nil {
			return nil, fmt.Errorf("reclaim abandoned: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reclaim abandoned: %w", err)
	}
	return out, nil
}
