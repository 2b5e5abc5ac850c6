package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

// Pause holds back what scope and key cover for every instance, for wait on the
// database's clock, and returns how long it now lasts; a later pause of the same
// source never shortens it. Pause is the first CA's; PauseAt names the CA.
func (q *Queue) Pause(ctx context.Context, scope, key, source string, wait time.Duration, reason string) (time.Duration, error) {
	directory := ""
	if scope == issuing.ScopeCA {
		directory = key
	}
	return q.PauseAt(ctx, directory, scope, key, source, wait, reason)
}

var pauseAtSQL = `
INSERT INTO certworker_pauses AS p (directory, scope, key, source, paused_until, reason, held_since)
VALUES ($6, $1, $2, $3, now() + make_interval(secs => $4), $5, now())
ON CONFLICT (directory, scope, key, source) DO UPDATE SET
    held_since = ` + heldSinceSQL + `,
    paused_until = GREATEST(p.paused_until, EXCLUDED.paused_until),
    reason = CASE WHEN EXCLUDED.paused_until > p.paused_until THEN EXCLUDED.reason ELSE p.reason END,
    updated_at = now()
RETURNING ` + secondsUntilSQL("paused_until")

// PauseAt is Pause for the CA at directory; a ScopeCA pause's key is the directory.
func (q *Queue) PauseAt(ctx context.Context, directory, scope, key, source string, wait time.Duration, reason string) (time.Duration, error) {
	if scope == issuing.ScopeCA {
		key = directory
	}
	var left float64
	err := q.db.QueryRow(ctx, pauseAtSQL, scope, key, source, seconds(wait), q.errorText(ctx, reason), directory).Scan(&left)
	if err != nil {
		return 0, fmt.Errorf("pause %s %s: %w", scope, key, err)
	}
	return durationFromSeconds(left), nil
}

// outageForgotten is how long after an unreachable pause ends a failure starts a new
// outage, so tries of the first CA during a fallback do not each start one.
const outageForgotten = time.Hour

var pauseUnreachableSQL = `
INSERT INTO certworker_pauses AS p (directory, scope, key, source, paused_until, reason, failures, held_since)
VALUES ($1, 'ca', $1, 'unreachable', now() + make_interval(secs => $3), $2, 1, now())
ON CONFLICT (directory, scope, key, source) DO UPDATE SET
    held_since = CASE WHEN p.paused_until < now() - make_interval(secs => $5) THEN now()
                      ELSE COALESCE(p.held_since, p.created_at) END,
    failures = CASE WHEN p.paused_until < now() - make_interval(secs => $5) THEN 1
                    WHEN p.paused_until <= now() THEN p.failures + 1 ELSE p.failures END,
    paused_until = CASE WHEN p.paused_until < now() - make_interval(secs => $5)
        THEN now() + make_interval(secs => $3)
        WHEN p.paused_until <= now()
        THEN now() + make_interval(secs => LEAST($3 * power(2, LEAST(p.failures, 30)), $4))
        ELSE p.paused_until END,
    reason = EXCLUDED.reason,
    updated_at = now()
RETURNING failures, ` + secondsUntilSQL("paused_until")

// PauseUnreachable pauses the CA at directory for every instance, for base doubled
// per consecutive failure up to limit; orders failing together under one pause are
// one failure. The outage runs from its first failure until an answer
// (ClearUnreachable), or outageForgotten after its pause ended.
func (q *Queue) PauseUnreachable(ctx context.Context, directory, reason string, base, limit time.Duration) (issuing.Unreachable, error) {
	var u issuing.Unreachable
	var left float64
	err := q.db.QueryRow(ctx, pauseUnreachableSQL,
		directory, q.errorText(ctx, reason), seconds(base), seconds(limit), seconds(outageForgotten)).Scan(&u.Failures, &left)
	if err != nil {
		return u, fmt.Errorf("pause unreachable CA: %w", err)
	}
	u.For = durationFromSeconds(left)
	return u, nil
}

var clearUnreachableSQL = `
DELETE FROM certworker_pauses WHERE scope = 'ca' AND key = $1 AND source = 'unreachable'`

// ClearUnreachable ends the CA's unreachable state, reporting whether there was one.
func (q *Queue) ClearUnreachable(ctx context.Context, directory string) (bool, error) {
	tag, err := q.db.Exec(ctx, clearUnreachableSQL, directory)
	if err != nil {
		return false, fmt.Errorf("clear unreachable CA: %w", err)
	}
	return tag.RowsAffected() > 0, nil
}

var caPauseSQL = `
SELECT scope, key, source, paused_until, reason, directory FROM certworker_pauses
WHERE scope = 'ca' AND key = $1 AND paused_until > now()
ORDER BY paused_until DESC LIMIT 1`

// CAPause is the pause in force on the CA at directory that ends last, or nil.
func (q *Queue) CAPause(ctx context.Context, directory string) (*issuing.PauseState, error) {
	var p issuing.PauseState
	err := q.db.QueryRow(ctx, caPauseSQL, directory).Scan(&p.Scope, &p.Key, &p.Source, &p.PausedUntil, &p.Reason, &p.Directory)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read CA pause: %w", err)
	}
	return &p, nil
}
