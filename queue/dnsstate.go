package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

// maxChallengeReason bounds the reason stored: it quotes DNS names, 253 bytes each.
const maxChallengeReason = 1000

var recordChallengeSQL = `
INSERT INTO certworker_dns_state (domain_id, challenge, challenge_reason, challenge_at, updated_at)
VALUES ($1::uuid, $2, $3, now(), now())
ON CONFLICT (domain_id) DO UPDATE
    SET challenge = EXCLUDED.challenge, challenge_reason = EXCLUDED.challenge_reason,
        challenge_at = EXCLUDED.challenge_at, updated_at = EXCLUDED.updated_at
WHERE certworker_dns_state.challenge IS DISTINCT FROM EXCLUDED.challenge
   OR certworker_dns_state.challenge_reason IS DISTINCT FROM EXCLUDED.challenge_reason`

// RecordChallenge records the challenge chosen for a domain's order and why, for
// `status DOMAIN`. It writes certworker's own table only (no lock on the proxy's
// row), and only when what it says changed.
func (q *Queue) RecordChallenge(ctx context.Context, domainID, challenge, reason string) error {
	if len(reason) > maxChallengeReason {
		reason = reason[:maxChallengeReason]
	}
	_, err := q.db.Exec(ctx, recordChallengeSQL,
		domainID, challenge, reason)
	if err != nil {
		return fmt.Errorf("record the challenge chosen: %w", err)
	}
	return nil
}

// The waiting-for-DNS schedule. A domain waiting for its DNS is out of
// line (ssl_held HeldDNS) and checked by DNS alone, never by the CA.
const (
	// WaitFirstHour is how long a wait is checked at WaitCheckFirst: a tenant moving
	// DNS does so soon after verifying, and is served within 30 s of the resolver
	// answering (one check interval, the waiter's tick and a claim).
	WaitFirstHour  = time.Hour
	WaitCheckFirst = 10 * time.Second
	// WaitCheckLater is the least gap between two checks of a domain past its first
	// hour; under WaitChecksPerSecond for the fleet, the gap grows with the number of
	// such domains (100,000 of them: every 83 minutes).
	WaitCheckLater      = 5 * time.Minute
	WaitChecksPerSecond = 20
	// waitCheckLease is how long a check taken by one instance is kept from the
	// others: more than a check takes (the preflight's 10 s and its DNS).
	waitCheckLease = 30 * time.Second
)

// WaitCheckIn is the gap before the next check of a domain waiting since since, with
// stale domains past their first hour in the fleet.
func WaitCheckIn(now, since time.Time, stale int) time.Duration {
	if now.Sub(since) < WaitFirstHour {
		return WaitCheckFirst
	}
	return max(WaitCheckLater, time.Duration(stale)*time.Second/WaitChecksPerSecond)
}

// Wait hands a claim back uncharged to wait for its DNS: pending, out of line,
// ssl_error msg (written only when it changed), its attempt time as before the claim,
// no notification (nothing is due); and records the wait (since when; its next check
// in checkIn; the answer seen).
//
// Since when is the clock of --dns-wait-max, and it runs across waits that end and
// begin again: a wait that EndWait ended (the check saw the DNS right) and the next
// claim's preflight begins again (it flapped back) keeps the time the first began.
// It starts over when the domain comes to this wait without the words of a wait in
// its ssl_error, as the claim found it: a first wait, or one after the domain was
// issued (MarkActive forgets the clock, and writes ssl_error), retried (the proxy's retry and `certworker
// retry` clear it), or failed at the CA meanwhile (charged, and bounded by
// --max-attempts instead). Otherwise a name whose DNS flaps never reaches the max.
func (q *Queue) Wait(ctx context.Context, c issuing.Claim, msg, answer string, checkIn time.Duration) error {
	msg = q.errorText(ctx, msg) // the preflight's words carry the tenant's DNS and redirects
	var one int
	err := q.quietly(ctx, `
WITH before AS (
    SELECT COALESCE(ssl_error LIKE '`+issuing.WaitingPrefix+`%', false) AS waited FROM proxy_domains WHERE id = $1
), d AS (
    UPDATE proxy_domains SET
        ssl_status = 'pending', ssl_last_attempt_at = ssl_claim_prev_attempt_at, updated_at = now(),
        ssl_held = '`+HeldDNS+`',
        ssl_error = CASE WHEN ssl_error IS DISTINCT FROM $3 THEN $3 ELSE ssl_error END,
        `+releaseClaimSQL+`
    WHERE `+heldSQL+`
    RETURNING id, `+eventSQL("proxy_domains", "'waiting_for_dns'", reasonSQL("proxy_domains"), "ssl_error")+` AS event_id
), s AS (
    INSERT INTO certworker_dns_state AS s (domain_id, waiting_since, next_check_at, answer, updated_at)
    SELECT id, now(), now() + make_interval(secs => $4), $5, now() FROM d
    ON CONFLICT (domain_id) DO UPDATE SET
        waiting_since = CASE WHEN (SELECT waited FROM before) THEN COALESCE(s.waiting_since, EXCLUDED.waiting_since)
                             ELSE EXCLUDED.waiting_since END,
        next_check_at = EXCLUDED.next_check_at, answer = EXCLUDED.answer, updated_at = now()
)
SELECT 1 FROM d`, []any{c.ID, c.Token, msg, checkIn.Seconds(), answer}, &one)
	if errors.Is(err, pgx.ErrNoRows) {
		return q.whyNotHeld(ctx, c)
	}
	if err != nil {
		return fmt.Errorf("wait for DNS: %w", err)
	}
	return nil
}

// DueWait is a waiting domain whose check is due.
type DueWait struct {
	ID, TenantID, Domain string
	Since                time.Time
	Answer               string
}

var forgetOrphanWaitsSQL = `
DELETE FROM certworker_dns_state s
WHERE s.next_check_at <= now() AND NOT EXISTS (SELECT 1 FROM proxy_domains d WHERE d.id = s.domain_id)`

var endStaleWaitsSQL = `
UPDATE certworker_dns_state s SET next_check_at = NULL, waiting_since = NULL, updated_at = now()
WHERE s.next_check_at <= now()
  AND NOT EXISTS (SELECT 1 FROM proxy_domains d WHERE d.id = s.domain_id
                  AND ` + claimableSQL + ` AND d.ssl_held = '` + HeldDNS + `')`

var takeDueWaitsSQL = `
UPDATE certworker_dns_state s SET next_check_at = now() + make_interval(secs => $2)
FROM (SELECT s.domain_id, d.tenant_id, d.domain FROM certworker_dns_state s JOIN proxy_domains d ON d.id = s.domain_id
      WHERE s.next_check_at <= now()
      ORDER BY s.next_check_at LIMIT $1
      FOR UPDATE OF s SKIP LOCKED) due
WHERE s.domain_id = due.domain_id
RETURNING s.domain_id::text, due.tenant_id::text, due.domain, COALESCE(s.waiting_since, now()), COALESCE(s.answer, ''),
    (SELECT count(*) FROM certworker_dns_state x
     WHERE x.next_check_at IS NOT NULL AND x.waiting_since < now() - make_interval(secs => $3))::int`

// DueWaits takes up to limit waits whose check is due, keeping them from the other
// instances for waitCheckLease, and returns them with the number of waits past their
// first hour (WaitCheckIn's stale). Waits of domains no longer waiting (claimed after
// a retry, issued, no longer verified or acme) are ended on the way, and those of
// deleted domains removed.
func (q *Queue) DueWaits(ctx context.Context, limit int) ([]DueWait, int, error) {
	if _, err := q.db.Exec(ctx, forgetOrphanWaitsSQL); err != nil {
		return nil, 0, fmt.Errorf("remove waits of deleted domains: %w", err)
	}
	if _, err := q.db.Exec(ctx, endStaleWaitsSQL); err != nil {
		return nil, 0, fmt.Errorf("end waits of domains no longer waiting: %w", err)
	}
	rows, err := q.db.Query(ctx, takeDueWaitsSQL,
		limit, waitCheckLease.Seconds(), WaitFirstHour.Seconds())
	if err != nil {
		return nil, 0, fmt.Errorf("take due DNS checks: %w", err)
	}
	stale := 0
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DueWait, error) {
		var w DueWait
		err := r.Scan(&w.ID, &w.TenantID, &w.Domain, &w.Since, &w.Answer, &stale)
		return w, err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("take due DNS checks: %w", err)
	}
	return out, stale, nil
}

// recheckWaitSQL schedules the next check and, when $4, records the check in the
// domain's history while it still waits (a repeat of its wait: counted up).
var recheckWaitSQL = `
UPDATE certworker_dns_state SET next_check_at = now() + make_interval(secs => $2), answer = $3, updated_at = now()
WHERE domain_id = $1::uuid AND next_check_at IS NOT NULL
RETURNING (SELECT ` + eventSQL("d", "'waiting_for_dns'", reasonSQL("d"), "d.ssl_error") + ` FROM proxy_domains d
           WHERE $4 AND d.id = $1::uuid AND ` + claimableAsSQL("d") + ` AND d.ssl_held = '` + HeldDNS + `'
             AND d.ssl_error LIKE 'waiting for DNS:%')`

var recheckErrorSQL = `
UPDATE proxy_domains SET ssl_error = $2, updated_at = now()
WHERE id = $1::uuid AND ` + claimableSQL + ` AND ssl_held = '` + HeldDNS + `'
  AND ssl_error LIKE 'waiting for DNS:%' AND ssl_error IS DISTINCT FROM $2
RETURNING ` + eventSQL("proxy_domains", "'waiting_for_dns'", reasonSQL("proxy_domains"), "ssl_error")

// Recheck schedules a waiting domain's next check in checkIn, with the answer seen;
// msg, when not "", replaces its ssl_error, only when that changed and only while it
// still waits (a retry or a claim meanwhile wins). Each check is a waiting_for_dns
// event in the domain's history, written with whichever write records it: the new
// ssl_error, or else the next check.
func (q *Queue) Recheck(ctx context.Context, id string, checkIn time.Duration, answer, msg string) error {
	changed := false
	if msg != "" {
		tag, err := q.db.Exec(ctx, recheckErrorSQL, id, q.errorText(ctx, msg))
		if err != nil {
			return fmt.Errorf("record what the DNS check saw: %w", err)
		}
		changed = tag.RowsAffected() > 0
	}
	if _, err := q.db.Exec(ctx, recheckWaitSQL, id, checkIn.Seconds(), answer, !changed); err != nil {
		return fmt.Errorf("schedule the next DNS check: %w", err)
	}
	return nil
}

var endWaitDomainSQL = `
UPDATE proxy_domains SET ssl_held = '` + HeldBackoff + `'
WHERE id = $1::uuid AND ` + claimableSQL + ` AND ssl_held = '` + HeldDNS + `'`

var endWaitStateSQL = `
UPDATE certworker_dns_state SET next_check_at = NULL, updated_at = now()
WHERE domain_id = $1::uuid`

// EndWait puts a waiting domain back in line: its DNS now allows validation. Held
// as HeldBackoff, ReturnHeld brings it back at its place (its backoff, if any, has run
// out while it waited), which the caller's next claim does. It reports whether the
// domain was still waiting. The wait's clock is kept (see Wait): a wait that begins
// again at the next claim goes on counting from the first.
func (q *Queue) EndWait(ctx context.Context, id string) (bool, error) {
	tag, err := q.db.Exec(ctx, endWaitDomainSQL, id)
	if err != nil {
		return false, fmt.Errorf("end the wait for DNS: %w", err)
	}
	if _, err := q.db.Exec(ctx, endWaitStateSQL, id); err != nil {
		return false, fmt.Errorf("end the wait for DNS: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

var expireWaitDomainSQL = `
UPDATE proxy_domains SET ssl_status = 'failed', ssl_held = NULL, ssl_error = $2, updated_at = now()
WHERE id = $1::uuid AND ` + claimableSQL + ` AND ssl_held = '` + HeldDNS + `'
RETURNING ` + eventSQL("proxy_domains", "'failed'", reasonSQL("proxy_domains"), "ssl_error")

var expireWaitStateSQL = `
UPDATE certworker_dns_state SET next_check_at = NULL, waiting_since = NULL, updated_at = now()
WHERE domain_id = $1::uuid`

// ExpireWait marks a domain that waited longer than --dns-wait-max failed, with msg,
// and ends its wait. It reports whether the domain was still waiting.
func (q *Queue) ExpireWait(ctx context.Context, id, msg string) (bool, error) {
	msg = q.errorText(ctx, msg)
	tag, err := q.db.Exec(ctx, expireWaitDomainSQL, id, msg)
	if err != nil {
		return false, fmt.Errorf("fail a domain whose DNS never pointed here: %w", err)
	}
	if _, err := q.db.Exec(ctx, expireWaitStateSQL, id); err != nil {
		return false, fmt.Errorf("end the wait for DNS: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

var returnRetriedSQL = `
UPDATE proxy_domains SET ssl_held = '` + HeldBackoff + `'
WHERE id IN (SELECT id FROM proxy_domains
             WHERE ` + claimableSQL + ` AND ssl_held = '` + HeldDNS + `'
               AND (ssl_error IS NULL OR ssl_error NOT LIKE 'waiting for DNS:%')
             LIMIT $1 FOR UPDATE SKIP LOCKED)`

// ReturnRetried puts back in line, as HeldBackoff rows that ReturnHeld brings back at
// once, up to limit waiting domains that someone retried (the proxy's retry or
// `certworker retry` cleared their 'waiting for DNS:' error), and says how many. The
// waiter calls it at every tick: a retry brings a waiting domain's check forward to
// its next claim. It reads proxy_domains_wait_retried_idx, which holds those rows
// alone.
func (q *Queue) ReturnRetried(ctx context.Context, limit int) (int64, error) {
	tag, err := q.db.Exec(ctx, returnRetriedSQL, limit)
	if err != nil {
		return 0, fmt.Errorf("return retried waits: %w", err)
	}
	return tag.RowsAffected(), nil
}
