package queue

import (
	"context"
	"fmt"
	"time"
)

// NextDue is the earliest time something becomes due without a wake-up from outside:
// a backoff running out, a certificate's renewal time, or a lease expiring. It is the
// zero time when nothing is scheduled. A domain already due gives now.
//
// The worker sets its timer for exactly this time (capped by --poll-interval), so a
// retry scheduled for 60 s happens at 60 s rather than at the next poll.
func (q *Queue) NextDue(ctx context.Context) (time.Time, error) {
	var next *time.Time
	err := q.db.QueryRow(ctx, `
SELECT LEAST(
    (SELECT min(CASE WHEN ssl_last_attempt_at IS NULL THEN now()
                     ELSE ssl_last_attempt_at + make_interval(secs => `+backoffSQL("$2", "$3")+`) END)
       FROM proxy_domains
      WHERE verification_status = 'verified' AND ssl_provider = 'acme'
        AND ssl_status = 'pending' AND ssl_attempts < $1),
    (SELECT c.renew_at
       FROM proxy_certificates c JOIN proxy_domains d ON d.domain = c.domain
      WHERE c.auto_renew AND c.renew_at IS NOT NULL
        AND d.ssl_status = 'active' AND d.ssl_provider = 'acme'
        AND d.verification_status = 'verified'
      ORDER BY c.renew_at LIMIT 1),
    (SELECT min(COALESCE(ssl_lease_expires_at,
                         COALESCE(ssl_last_attempt_at, updated_at) + make_interval(secs => $4)))
       FROM proxy_domains
      WHERE ssl_status = 'provisioning' AND ssl_provider = 'acme'))`,
		q.cfg.MaxAttempts, seconds(q.cfg.RetryBase), seconds(q.cfg.RetryMax),
		seconds(unleasedGrace)).Scan(&next)
	if err != nil {
		return time.Time{}, fmt.Errorf("next due: %w", err)
	}
	if next == nil {
		return time.Time{}, nil
	}
	return *next, nil
}
