package queue

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/certworker/certworker/queue/issuing"
)

// NextDue is how long until something becomes claimable without a wake-up from
// outside: a backoff running out, or a pause ending. ok is false when nothing is
// scheduled; a domain due already gives 0. The delay is computed on the database's
// clock, the one the claim compares with.
//
// The worker sets its timer for exactly this delay (capped by --poll-interval), so a
// retry scheduled for 60 s happens at 60 s rather than at the next poll. While the CA
// at directory is paused, nothing is claimable before the pause ends. A pause the
// ledger wrote for the CA's account is not such a pause: the claim judges it row by
// row, as it judges a registered domain's (a renewal passes it, ledgerExemptSQL), so
// it ends a wait like theirs and postpones nothing.
//
// Rows held out of line under a pause that is no longer in force are due now, for
// ReturnHeld to bring back: a pause that ended between the claim that held them and
// this look (a ledger's pause ends at the exact moment of its bucket's next token) is
// no longer among the pauses to wait for, and without them the timer would wait for
// the poll. Their keys are read as ReturnHeld reads them, once each.
//
// It reads one index entry per attempt count below the cap of the curve (the oldest
// attempt with that count is the first whose backoff runs out) and one range for the
// counts at the cap, so its cost follows the attempt limit, not the queue's length.
// The number of those counts is written into the statement, not passed as a
// parameter: it is fixed by the configuration, and as a parameter the server's
// generic plan guessed a thousand of them, looked costlier than a custom one, and
// every call was planned afresh (planning was 5.5 of its 5.65 ms in
// bench/fleet-at-rest.txt).
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

// nextDueStatement is NextDue's statement and its arguments.
func (q *Queue) nextDueStatement(directory string) (string, []any) {
	capped := min(firstCapped(q.cfg), q.cfg.MaxAttempts)
	args := []any{q.cfg.MaxAttempts, seconds(q.cfg.RetryBase), seconds(q.cfg.RetryMax), directory, capped}
	// A pause of the CA holds back every row until it ends, but with a second CA a
	// row held back at the first may go to the second before then: the routed claim
	// holds it out until its decision can change (ssl_held_until), which
	// routedUntilSQL reads. So with a second CA the CA's pause does not postpone ($6).
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

// firstCapped is the first attempt count whose backoff is the cap: every count from
// it on waits the same.
func firstCapped(c issuing.Config) int {
	for n := 0; n < issuing.MaxShift; n++ {
		if c.Backoff(n) >= c.RetryMax {
			return n
		}
	}
	return issuing.MaxShift
}

// Maintenance is when the maintenance steps next have work, as delays from now on
// the database's clock; a nil field means nothing is scheduled for that step.
type Maintenance struct {
	// Renewals: a certificate due for renewal, or a renewal with time to spare
	// becoming urgent. (The renewal-information reads keep their own time:
	// NextRenewalInfo.)
	Renewals *time.Duration
	// Reclaim: a lease (or, for a row claimed without one, the unleased grace)
	// running out.
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

// NextMaintenance is when the maintenance steps next have work. The two are apart
// because the worker may hold the reclaim back for a while (after an outage) while
// renewals must not wait.
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

// PromoteUrgentRenewals moves renewals that waited behind first issuances until
// their renewal became urgent (ssl_renew_by passed) to the front tier, and returns
// how many. The tier is set when a row enters the queue; time alone changes this one.
// A promoted row takes its tenant's next turn in tier 1 (placeSQL), earliest expiry
// first among the tenant's rows promoted together; rows locked by someone else (the
// proxy's open transaction) are skipped and promoted by the next run.
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
