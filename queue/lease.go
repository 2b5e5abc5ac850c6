package queue

import (
	"context"
	"fmt"
	"time"

	"github.com/certworker/certworker/queue/issuing"
)

// Leases is what Heartbeat found of the claims it was given, by token.
type Leases struct {
	// Renewed: held, and the lease now runs a full Lease from the statement's start.
	Renewed []string
	// Expired: the token is on its row but the lease had run out; not renewed (see
	// Heartbeat).
	Expired []string
	// Busy: held, but the row is locked; not renewed, not waited for.
	Busy []string
	// Lost: no longer held. The caller stops the order and writes nothing.
	Lost []string
}

// Heartbeat renews the leases of the given claims, by token, and says what became of
// each; with no tokens it still makes the round trip. A lease that has run out is
// never renewed: its holder cannot know whether the row was reclaimed meanwhile.
func (q *Queue) Heartbeat(ctx context.Context, tokens []string) (Leases, error) {
	rows, err := q.renewLeases(ctx, tokens)
	if err != nil {
		return Leases{}, fmt.Errorf("renew leases: %w", err)
	}
	var l Leases
	found := make(map[string]bool, len(tokens))
	for _, r := range rows {
		found[r.token] = true
		switch {
		case r.renewed:
			l.Renewed = append(l.Renewed, r.token)
		case r.unexpired:
			l.Busy = append(l.Busy, r.token)
		default:
			l.Expired = append(l.Expired, r.token)
		}
	}
	for _, t := range tokens {
		if !found[t] {
			l.Lost = append(l.Lost, t)
		}
	}
	return l, nil
}

// ConfirmClaim renews the lease of the claim with this token, as Heartbeat does, and
// returns how much is left on the database's clock: the check before the finalize
// (issuing.Request's ConfirmClaim). It returns ErrClaimLost when the token is not on
// its row, an error wrapping ErrLeaseDeadline when the lease had run out, and
// ErrClaimBusy when the row is locked; the lease is then not renewed.
func (q *Queue) ConfirmClaim(ctx context.Context, token string) (time.Duration, error) {
	rows, err := q.renewLeases(ctx, []string{token})
	if err != nil {
		return 0, fmt.Errorf("confirm the claim: %w", err)
	}
	switch {
	case len(rows) == 0:
		return 0, issuing.ErrClaimLost
	case rows[0].renewed:
		return rows[0].left, nil
	case rows[0].unexpired:
		return 0, issuing.ErrClaimBusy
	}
	return 0, fmt.Errorf("confirm the claim: the lease had run out: %w", issuing.ErrLeaseDeadline)
}

type leaseRow struct {
	token     string
	unexpired bool
	renewed   bool
	// left is the lease left at the statement's end (0 when not renewed).
	left time.Duration
}

var renewLeasesSQL = `
WITH mine AS (
    SELECT id, ssl_claim_token, COALESCE(` + leaseEndSQL("proxy_domains", "$2") + ` > now(), false) AS unexpired
    FROM proxy_domains
    WHERE ssl_status = 'provisioning' AND ssl_claim_token = ANY($1::uuid[])
), live AS (
    SELECT d.id FROM proxy_domains d
    WHERE d.id IN (SELECT id FROM mine WHERE unexpired)
      AND d.ssl_status = 'provisioning' AND d.ssl_claim_token = ANY($1::uuid[])
      AND ` + leaseEndSQL("d", "$2") + ` > now()
    FOR NO KEY UPDATE OF d SKIP LOCKED
), renewed AS (
    UPDATE proxy_domains d SET ssl_lease_expires_at = now() + make_interval(secs => $2)
    FROM live WHERE d.id = live.id
    RETURNING d.id, d.ssl_lease_expires_at
)
SELECT m.ssl_claim_token::text, m.unexpired,
       (SELECT ` + secondsUntilSQL("r.ssl_lease_expires_at") + ` FROM renewed r WHERE r.id = m.id)
FROM mine m`

// renewLeases is the one statement that renews leases, for Heartbeat and
// ConfirmClaim; a token on no provisioning row is not in its answer.
func (q *Queue) renewLeases(ctx context.Context, tokens []string) ([]leaseRow, error) {
	// mine reads from the snapshot; live re-reads and locks the unexpired rows (SKIP
	// LOCKED), rechecking rows changed since.
	rows, err := q.db.Query(ctx, renewLeasesSQL, tokens, seconds(q.cfg.Lease))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []leaseRow
	for rows.Next() {
		var r leaseRow
		var left *float64
		if err := rows.Scan(&r.token, &r.unexpired, &left); err != nil {
			return nil, err
		}
		if left != nil {
			r.renewed, r.left = true, secondsDuration(*left)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
