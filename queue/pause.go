package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

// Pause holds back what scope and key cover (ScopeCA: an ACME directory URL;
// ScopeRegisteredDomain: a registered domain; ScopeDomain: a domain name) for every
// instance, for wait from now on the database's clock. A later pause never shortens
// an earlier one of the same source; the reason of the longer one is kept. It returns
// how long the pause now lasts. A pause of a registered domain or a name is the first
// CA's (PauseAt names the CA).
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

// PauseAt is Pause for the CA at directory: nothing it says holds a domain back at
// another CA. A ScopeCA pause's key is the directory.
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

// outageForgotten is how long after the end of an unreachable pause a failure starts
// a new outage rather than continuing it (PauseUnreachable). Long against the CA's
// backoff (30 s at most): a fleet that sends every domain to a second CA tries the
// first only when its pause ends, and an outage must not look new at each try.
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

// PauseUnreachable records that the CA at directory could not be reached and pauses
// ordering from it for every instance, for base doubled per consecutive failure up to
// limit: the CA's own backoff, kept apart from any domain's (nothing is charged). The
// orders that fail together, while the pause they caused is in force (a fleet's
// --concurrency of them, when the pause ends and the CA is still down), are one
// failure: the backoff grows once per try of the CA, not once per order.
//
// The outage began (held_since) at its first failure, and goes on until an order gets
// an answer (ClearUnreachable), through the gaps between the pause's end and the next
// try. A row whose pause ended longer than outageForgotten ago is a new outage: no
// instance told of the CA's answer (the one that saw it down was restarted).
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

// ClearUnreachable ends the unreachable state of the CA at directory, after an order
// got an answer from it. It reports whether there was one to end.
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
