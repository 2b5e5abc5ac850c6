package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The fleet's duties (TakeDuty): work the fleet needs once, done by one instance.
const (
	// DutyMaintenance is the maintenance: reclaiming abandoned claims, marking
	// renewals, housekeeping.
	DutyMaintenance = "maintenance"
	// DutyFleetStats is the read of the fleet statistics for one CA's directory
	// (DutyFleetStats + directory).
	DutyFleetStats = "fleet_stats:"
)

var takeDutySQL = `
WITH taken AS (
    INSERT INTO certworker_fleet_duties AS f (duty, holder, expires_at)
    VALUES ($1, $2, now() + make_interval(secs => $3))
    ON CONFLICT (duty) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
        WHERE f.holder = EXCLUDED.holder OR f.expires_at <= now()
    RETURNING holder, expires_at
)
SELECT holder, extract(epoch FROM expires_at - now())::float8 FROM taken
UNION ALL
SELECT holder, extract(epoch FROM expires_at - now())::float8 FROM certworker_fleet_duties
WHERE duty = $1 AND NOT EXISTS (SELECT 1 FROM taken)`

// TakeDuty takes or renews the fleet's duty for holder for ttl, and reports whether
// holder has it: when nobody holds it, holder held it, or the holder's lease ran out.
// Otherwise left is how long the other holder's lease has to run.
func (q *Queue) TakeDuty(ctx context.Context, duty, holder string, ttl time.Duration) (held bool, left time.Duration, err error) {
	var by string
	var secs float64
	err = q.db.QueryRow(ctx, takeDutySQL, duty, holder, seconds(ttl)).Scan(&by, &secs)
	if errors.Is(err, pgx.ErrNoRows) {
		// Another instance took the duty first, after this statement's snapshot.
		return false, ttl, nil
	}
	if err != nil {
		return false, 0, fmt.Errorf("take fleet duty %s: %w", duty, err)
	}
	if by == holder {
		return true, 0, nil
	}
	return false, max(durationFromSeconds(secs), 0), nil
}

var releaseDutySQL = `DELETE FROM certworker_fleet_duties WHERE duty = $1 AND holder = $2`

// ReleaseDuty gives up holder's duty, if it holds it, so another instance takes it
// at its next look (a rolling restart hands duties on).
func (q *Queue) ReleaseDuty(ctx context.Context, duty, holder string) error {
	if _, err := q.db.Exec(ctx, releaseDutySQL, duty, holder); err != nil {
		return fmt.Errorf("release fleet duty %s: %w", duty, err)
	}
	return nil
}
