package queue

import (
	"context"
	"fmt"
)

// Leases is what Heartbeat found of the claims it was given, by token.
type Leases struct {
	// Renewed: held, and the lease now runs a full Lease from the statement's start.
	// The caller moves the claim's Deadline to a lease from the statement's send.
	Renewed []string
	// Expired: the token is still on its row, but the lease had run out. Not renewed:
	// once a lease has run out another instance may reclaim the row at any moment,
	// and the order's own deadline has passed, so it has stopped; renewing would
	// resurrect a claim that the rest of the fleet may already treat as abandoned. The
	// caller hands it back (uncharged) rather than go on.
	Expired []string
	// Busy: held and unexpired, but another transaction has the row locked (the
	// proxy's open write, the order's own finishing write). Not renewed this time, and
	// not waited for: one locked row must not hold up every other renewal. If the lock
	// outlasts the lease, the order's deadline stops it.
	Busy []string
	// Lost: no longer held: requeued by another instance after the lease ran out,
	// taken back by hand, or finished. The caller stops the order and writes nothing.
	Lost []string
}

// Heartbeat renews the leases of the given claims, by token, and says what became of
// each (Leases). With no tokens it still makes the round trip, which tells the caller
// whether the database answers.
//
// A lease that has run out is not renewed, even when nobody took the row: after a
// partition or a pause longer than the lease, an instance cannot know whether another
// has reclaimed the row and started ordering, and its order has stopped at its
// deadline (CONTRACT.md §5). It hands the claim back instead.
func (q *Queue) Heartbeat(ctx context.Context, tokens []string) (Leases, error) {
	// One scan of the provisioning rows: mine reads them from the statement's
	// snapshot; live re-reads the unexpired ones by id and locks them, skipping a
	// row another transaction has locked, and rechecking a row changed since the
	// snapshot (a reclaim that committed meanwhile) against its latest version.
	rows, err := q.db.Query(ctx, `
WITH mine AS (
    SELECT id, ssl_claim_token, COALESCE(`+leaseEndSQL("proxy_domains", "$2")+` > now(), false) AS unexpired
    FROM proxy_domains
    WHERE ssl_status = 'provisioning' AND ssl_claim_token = ANY($1::uuid[])
), live AS (
    SELECT d.id FROM proxy_domains d
    WHERE d.id IN (SELECT id FROM mine WHERE unexpired)
      AND d.ssl_status = 'provisioning' AND d.ssl_claim_token = ANY($1::uuid[])
      AND `+leaseEndSQL("d", "$2")+` > now()
    FOR NO KEY UPDATE OF d SKIP LOCKED
), renewed AS (
    UPDATE proxy_domains d SET ssl_lease_expires_at = now() + make_interval(secs => $2)
    FROM live WHERE d.id = live.id
    RETURNING d.id
)
SELECT m.ssl_claim_token::text, m.unexpired, EXISTS (SELECT 1 FROM renewed r WHERE r.id = m.id)
FROM mine m`, tokens, seconds(q.cfg.Lease))
	if err != nil {
		return Leases{}, fmt.Errorf("renew leases: %w", err)
	}
	defer rows.Close()
	var l Leases
	found := make(map[string]bool, len(tokens))
	for rows.Next() {
		var t string
		var unexpired, renewed bool
		if err := rows.Scan(&t, &unexpired, &renewed); err != nil {
			return Leases{}, fmt.Errorf("renew leases: %w", err)
		}
		found[t] = true
		switch {
		case renewed:
			l.Renewed = append(l.Renewed, t)
		case unexpired:
			l.Busy = append(l.Busy, t)
		default:
			l.Expired = append(l.Expired, t)
		}
	}
	if err := rows.Err(); err != nil {
		return Leases{}, fmt.Errorf("renew leases: %w", err)
	}
	for _, t := range tokens {
		if !found[t] {
			l.Lost = append(l.Lost, t)
		}
	}
	return l, nil
}
