package queue

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/certworker/certworker/queue/issuing"
)

// NextDue is how long until something becomes claimable without a wake-up (a
// backoff running out, a pause ending), on the database's clock; 0 when due now, ok
// false when nothing is scheduled. A ledger's account pause postpones nothing: the
// claim judges it per row. Rows held out of line under a pause no longer in force are
// due now, for ReturnHeld to bring back (a ledger's pause ends at its bucket's next
// token, which may fall between the claim that held them and this look). Its cost
// follows the attempt limit, not the queue; the count of attempt values is a literal
// so one plan serves (docs/internals.md).
func (q *Queue) NextDue(ctx context.Context, directory string) (d time.Duration, ok bool, err error) {
	var secs *float64
	sql, args := q.nextDueStatement(directory)
	err = q.db.QueryRow(ctx, sql, args...).Scan(&secs)
	if err != nil {
		return 0, false, fmt.Errorf("next due: %w", err)
	}
	if secs == nil {
		return 0, false, nil
	}
	return durationFromSeconds(*secs), true, nil
}

// NextDueSeeing is NextDue, and which of xids (32-bit transaction ids of commits a
// logical stream announced) its snapshot did not see yet: a commit is streamed a
// moment before a new snapshot sees it, and until it does, NextDue's answer leaves out
// its rows. unseen is nil when xids is empty; the statement is then NextDue's.
func (q *Queue) NextDueSeeing(ctx context.Context, directory string, xids []uint32) (d time.Duration, ok bool, unseen []uint32, err error) {
	if len(xids) == 0 {
		d, ok, err = q.NextDue(ctx, directory)
		return d, ok, nil, err
	}
	var secs *float64
	var snap string
	sql, args := q.nextDueStatement(directory)
	// pg_current_snapshot() is the statement's own snapshot, the one NextDue's scan used.
	err = q.db.QueryRow(ctx, sql+`, pg_current_snapshot()::text`, args...).Scan(&secs, &snap)
	if err != nil {
		return 0, false, nil, fmt.Errorf("next due: %w", err)
	}
	s, err := parseSnapshot(snap)
	if err != nil {
		return 0, false, nil, fmt.Errorf("next due: %w", err)
	}
	for _, x := range xids {
		if !s.sees(x) {
			unseen = append(unseen, x)
		}
	}
	if secs == nil {
		return 0, false, unseen, nil
	}
	return durationFromSeconds(*secs), true, unseen, nil
}

// snapshot is a pg_snapshot: transactions below xmin have ended, those from xmax on
// had not, and of those between, the ones in xip were running.
type snapshot struct {
	xmin, xmax uint64
	xip        map[uint64]bool
}

// parseSnapshot reads pg_snapshot's text form, xmin:xmax:xip1,xip2,...
func parseSnapshot(text string) (snapshot, error) {
	parts := strings.Split(text, ":")
	if len(parts) != 3 {
		return snapshot{}, fmt.Errorf("snapshot %q: want xmin:xmax:xip", text)
	}
	var s snapshot
	var err error
	if s.xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return snapshot{}, fmt.Errorf("snapshot %q: xmin: %w", text, err)
	}
	if s.xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return snapshot{}, fmt.Errorf("snapshot %q: xmax: %w", text, err)
	}
	if s.xmin > s.xmax {
		return snapshot{}, fmt.Errorf("snapshot %q: xmin after xmax", text)
	}
	s.xip = map[uint64]bool{}
	if parts[2] != "" {
		for _, f := range strings.Split(parts[2], ",") {
			x, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return snapshot{}, fmt.Errorf("snapshot %q: xip: %w", text, err)
			}
			s.xip[x] = true
		}
	}
	return s, nil
}

// sees reports whether the snapshot sees xid's end. A 32-bit id is widened to the
// 64-bit one nearest xmax: an announced commit is recent, so within 2^31 of it.
func (s snapshot) sees(xid uint32) bool {
	full := int64(s.xmax) + int64(int32(xid-uint32(s.xmax)))
	switch {
	case full < int64(s.xmin):
		return true
	case full >= int64(s.xmax):
		return false
	}
	return !s.xip[uint64(full)]
}

// nextDueStatement is NextDue's statement and its arguments; its one column ends the
// statement.
func (q *Queue) nextDueStatement(directory string) (string, []any) {
	capped := min(firstCapped(q.cfg), q.cfg.MaxAttempts)
	args := []any{q.cfg.MaxAttempts, seconds(q.cfg.RetryBase), seconds(q.cfg.RetryMax), directory, capped}
	// With a second CA, the first CA's pause does not postpone ($6): routedUntilSQL.
	args = append(args, q.cfg.Fallback == nil)
	return `
WITH RECURSIVE ` + heldKeysSQL("held_keys") + `, per_count AS (
    SELECT k, r.last
    FROM generate_series(0, ` + strconv.Itoa(capped-1) + `) AS k
    CROSS JOIN LATERAL (
        SELECT ssl_last_attempt_at AS last FROM proxy_domains
        WHERE ` + claimableSQL + ` AND ` + dueByBackoffSQL + ` AND ssl_attempts = k
        ORDER BY ssl_last_attempt_at NULLS FIRST LIMIT 1) r
), queued AS (
    SELECT min(CASE WHEN last IS NULL THEN now()
                    ELSE last + make_interval(secs => ` + backoffSQL("k", "$2", "$3") + `) END) AS at
    FROM per_count
    UNION ALL
    SELECT min(CASE WHEN ssl_last_attempt_at IS NULL THEN now()
                    ELSE ssl_last_attempt_at + make_interval(secs => ` + backoffSQL("ssl_attempts", "$2", "$3") + `) END)
    FROM proxy_domains
    WHERE ` + claimableSQL + ` AND ` + dueByBackoffSQL + ` AND (ssl_attempts < 0 OR ssl_attempts >= $5) AND ssl_attempts < $1
    UNION ALL
    (SELECT now() FROM held_keys
     WHERE held_keys.k IS NOT NULL AND held_keys.k NOT IN ('` + HeldDNS + `', '` + HeldRouted + `')
       AND ` + pauseOverSQL("held_keys.k") + `
     LIMIT 1)
)
SELECT ` + secondsUntilSQL(`LEAST(GREATEST(
    LEAST((SELECT min(at) FROM queued),
          (SELECT min(paused_until) FROM certworker_pauses
           WHERE (scope <> 'ca' OR (key = $4 AND source = 'ledger')) AND paused_until > now())),
    (SELECT max(paused_until) FROM certworker_pauses
     WHERE $6 AND scope = 'ca' AND key = $4 AND source <> 'ledger' AND paused_until > now())),
    `+routedUntilSQL+`)`), args
}

// firstCapped is the first attempt count whose backoff is the cap.
func firstCapped(c issuing.Config) int {
	for n := 0; n < issuing.MaxShift; n++ {
		if c.Backoff(n) >= c.RetryMax {
			return n
		}
	}
	return issuing.MaxShift
}

// Maintenance is when the maintenance steps next have work (nil: nothing).
type Maintenance struct {
	// Renewals: a certificate due for renewal, or a renewal becoming urgent.
	Renewals *time.Duration
	// Reclaim: a lease (or the unleased grace) running out.
	Reclaim *time.Duration
}

var nextMaintenanceSQL = `
SELECT ` + secondsUntilSQL(`LEAST(
    (SELECT c.renew_at
       FROM proxy_certificates c JOIN proxy_domains d ON d.domain = c.domain
      WHERE c.auto_renew AND c.renew_at IS NOT NULL
        AND d.ssl_status = 'active' AND `+managedSQL("d")+`
      ORDER BY c.renew_at LIMIT 1),
    (SELECT min(ssl_renew_by) FROM proxy_domains WHERE ssl_queue_tier = 3 AND `+claimableSQL+`))`) + `,
    ` + secondsUntilSQL(`
    (SELECT min(COALESCE(`+leaseEndSQL("proxy_domains", "$2")+`,
                         COALESCE(ssl_last_attempt_at, updated_at) + make_interval(secs => $1)))
       FROM proxy_domains WHERE ssl_status = 'provisioning' AND ssl_provider = 'acme')`)

// NextMaintenance is when the maintenance steps next have work, apart since the
// reclaim may be held back while renewals must not wait.
func (q *Queue) NextMaintenance(ctx context.Context) (Maintenance, error) {
	var renewals, reclaim *float64
	err := q.db.QueryRow(ctx, nextMaintenanceSQL,
		seconds(unleasedGrace), seconds(q.cfg.Lease)).Scan(&renewals, &reclaim)
	if err != nil {
		return Maintenance{}, fmt.Errorf("next maintenance: %w", err)
	}
	return Maintenance{Renewals: optionalDuration(renewals), Reclaim: optionalDuration(reclaim)}, nil
}

func optionalDuration(secs *float64) *time.Duration {
	if secs == nil {
		return nil
	}
	d := durationFromSeconds(*secs)
	return &d
}

var promoteUrgentRenewalsSQL = `
WITH due AS (
    SELECT id, tenant_id, ssl_renew_by FROM proxy_domains
    WHERE ssl_queue_tier = 3 AND ` + claimableSQL + ` AND ssl_renew_by <= now()
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), placed AS (
    SELECT l.id, ` + placeSQL("l.tenant_id", "1") + `
        + row_number() OVER (PARTITION BY l.tenant_id ORDER BY l.ssl_renew_by, l.id) - 1 AS seq
    FROM due l
)
UPDATE proxy_domains d SET ssl_queue_tier = 1, ssl_queue_seq = p.seq
FROM placed p WHERE d.id = p.id`

// PromoteUrgentRenewals moves renewals whose ssl_renew_by has passed to tier 1,
// into their tenant's next turn, and returns how many; locked rows wait.
func (q *Queue) PromoteUrgentRenewals(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := q.db.Exec(ctx, promoteUrgentRenewalsSQL, fillBatch)
		if err != nil {
			return total, fmt.Errorf("promote urgent renewals: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < fillBatch {
			return total, nil
		}
	}
}
