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

// The waiting-for-DNS schedule (docs/cas.md, "Waiting for DNS"). A domain waiting for
// its DNS is out of line (ssl_held HeldDNS) and checked by DNS alone, never by the CA.
const (
	// WaitFirstHour is how long a wait is checked at WaitCheckFirst: a tenant moving
	// DNS does so soon after verifying, and is served within 30 s of the resolver
	// answering (one check interval, the waiter's tick, the check and a claim). The
	// hour counts from paced_since, which a retry keeps: a name retried over and over
	// is not checked at this pace for ever.
	WaitFirstHour  = time.Hour
	WaitCheckFirst = 10 * time.Second
	// WaitSeenFor is how long after a TLS handshake for a waiting name
	// (certworker_name_seen) it is checked at WaitCheckFirst, whatever its age: the
	// handshake says the name's DNS moved, and the resolver may see it a little later.
	WaitSeenFor = 2 * time.Minute
	// WaitCheckLater is the least gap between two checks of a domain past its first
	// hour; under WaitChecksPerSecond for the fleet, the gap grows with the number of
	// such domains (100,000 of them: every 83 minutes).
	WaitCheckLater      = 5 * time.Minute
	WaitChecksPerSecond = 20
	// waitCheckLease is how long a check taken by one instance is kept from the
	// others when the taker names no lease of its own (TakeWaits.Lease).
	waitCheckLease = 30 * time.Second
)

// WaitCheckIn is the gap before the next check of a domain whose pace began at paced
// (DueWait.Paced), with stale domains past their first hour in the fleet: first in
// the first hour (WaitCheckFirst, or a test's shorter one).
func WaitCheckIn(now, paced time.Time, stale int, first time.Duration) time.Duration {
	if now.Sub(paced) < WaitFirstHour {
		return first
	}
	return max(WaitCheckLater, time.Duration(stale)*time.Second/WaitChecksPerSecond)
}

// Wait hands a claim back uncharged to wait for its DNS: pending, out of line,
// ssl_error msg (written only when it changed), its attempt time as before the claim,
// no notification (nothing is due); and records the wait (since when; its next check
// in checkIn; the answer seen; the pace's start).
//
// Since when is the clock of --dns-wait-max, and it runs across waits that end and
// begin again: a wait that EndWait ended (the check saw the DNS right) and the next
// claim's preflight begins again (it flapped back) keeps the time the first began.
// It starts over when the domain comes to this wait without the words of a wait in
// its ssl_error, as the claim found it: a first wait, or one after the domain was
// issued (MarkActive forgets the clock, and writes ssl_error), retried (the proxy's retry and `certworker
// retry` clear it), or failed at the CA meanwhile (charged, and bounded by
// --max-attempts instead). Otherwise a name whose DNS flaps never reaches the max.
//
// The pace's start (paced_since, WaitFirstHour) is kept by a retry too, so that a
// name retried over and over is checked at the first hour's pace for an hour in
// all; it starts over with the domain's issuance, its failure at --dns-wait-max, or
// a wait that begins after none for an hour.
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
    INSERT INTO certworker_dns_state AS s (domain_id, waiting_since, paced_since, next_check_at, answer, updated_at)
    SELECT id, now(), now(), now() + make_interval(secs => $4), $5, now() FROM d
    ON CONFLICT (domain_id) DO UPDATE SET
        waiting_since = CASE WHEN (SELECT waited FROM before) THEN COALESCE(s.waiting_since, EXCLUDED.waiting_since)
                             ELSE EXCLUDED.waiting_since END,
        paced_since = CASE WHEN s.paced_since IS NULL
                             OR s.next_check_at IS NULL AND s.updated_at < now() - make_interval(secs => $6)
                           THEN EXCLUDED.paced_since ELSE s.paced_since END,
        next_check_at = EXCLUDED.next_check_at, taken_until = NULL, answer = EXCLUDED.answer, updated_at = now()
)
SELECT 1 FROM d`, []any{c.ID, c.Token, msg, checkIn.Seconds(), answer, WaitFirstHour.Seconds()}, &one)
	if errors.Is(err, pgx.ErrNoRows) {
		return q.whyNotHeld(ctx, c)
	}
	if err != nil {
		return fmt.Errorf("wait for DNS: %w", err)
	}
	return nil
}

// DueWait is a waiting domain whose check is due: Since starts the clock of
// --dns-wait-max, Paced the pace of its checks (WaitCheckIn).
type DueWait struct {
	ID, TenantID, Domain string
	Since, Paced         time.Time
	Answer               string
}

// TakeWaits says which due checks DueWaits takes.
type TakeWaits struct {
	// Limit bounds the checks taken.
	Limit int
	// Share bounds the checks of one tenant running on this instance, those taken
	// and Busy's together (0: no bound). The checks taken go round the tenants: each
	// tenant's most overdue first, then each one's second, and so on.
	Share int
	// Busy is the checks of each tenant (by id) running on this instance.
	Busy map[string]int
	// Lease is how long the checks taken are kept from the other instances: as long
	// as one can run (0: waitCheckLease).
	Lease time.Duration
}

var forgetOrphanWaitsSQL = `
DELETE FROM certworker_dns_state s
WHERE s.next_check_at <= now() AND NOT EXISTS (SELECT 1 FROM proxy_domains d WHERE d.id = s.domain_id)`

var endStaleWaitsSQL = `
UPDATE certworker_dns_state s SET next_check_at = NULL, waiting_since = NULL, updated_at = now()
WHERE s.next_check_at <= now()
  AND NOT EXISTS (SELECT 1 FROM proxy_domains d WHERE d.id = s.domain_id
                  AND ` + claimableSQL + ` AND d.ssl_held = '` + HeldDNS + `')`

// takeDueWaitsSQL ranks the due checks within each tenant, most overdue first, and
// takes them round the tenants (every tenant's first, then every one's second...), no
// more of a tenant than its share left ($4 less what it has running: $5, $6), and
// only rows no other session holds (a check another instance is taking).
var takeDueWaitsSQL = `
WITH due AS (
    SELECT s.domain_id, d.tenant_id, d.domain, s.next_check_at,
           row_number() OVER (PARTITION BY d.tenant_id ORDER BY s.next_check_at, s.domain_id) AS rank
    FROM certworker_dns_state s JOIN proxy_domains d ON d.id = s.domain_id
    WHERE s.next_check_at <= now()
), busy AS (
    SELECT b.tenant_id, b.running FROM unnest($5::uuid[], $6::int[]) AS b(tenant_id, running)
), picked AS (
    SELECT due.domain_id, due.tenant_id, due.domain
    FROM due LEFT JOIN busy ON busy.tenant_id = due.tenant_id
    WHERE $4 <= 0 OR due.rank <= $4 - COALESCE(busy.running, 0)
    ORDER BY due.rank, due.next_check_at, due.domain_id
    LIMIT $1
), locked AS (
    SELECT s.domain_id FROM certworker_dns_state s
    WHERE s.domain_id IN (SELECT domain_id FROM picked) AND s.next_check_at <= now()
    FOR UPDATE SKIP LOCKED
)
UPDATE certworker_dns_state s
SET next_check_at = now() + make_interval(secs => $2), taken_until = now() + make_interval(secs => $2)
FROM picked
WHERE s.domain_id = picked.domain_id AND s.domain_id IN (SELECT domain_id FROM locked)
RETURNING s.domain_id::text, picked.tenant_id::text, picked.domain, COALESCE(s.waiting_since, now()),
    COALESCE(s.paced_since, s.waiting_since, now()), COALESCE(s.answer, ''),
    (SELECT count(*) FROM certworker_dns_state x
     WHERE x.next_check_at IS NOT NULL AND COALESCE(x.paced_since, x.waiting_since) < now() - make_interval(secs => $3))::int`

// DueWaits takes waits whose check is due, as t says, keeping them from the other
// instances for t.Lease, and returns them with the number of waits past their first
// hour (WaitCheckIn's stale). Waits of domains no longer waiting (claimed after a
// retry, issued, no longer verified or acme) are ended on the way, and those of
// deleted domains removed.
func (q *Queue) DueWaits(ctx context.Context, t TakeWaits) ([]DueWait, int, error) {
	if _, err := q.db.Exec(ctx, forgetOrphanWaitsSQL); err != nil {
		return nil, 0, fmt.Errorf("remove waits of deleted domains: %w", err)
	}
	if _, err := q.db.Exec(ctx, endStaleWaitsSQL); err != nil {
		return nil, 0, fmt.Errorf("end waits of domains no longer waiting: %w", err)
	}
	if t.Lease <= 0 {
		t.Lease = waitCheckLease
	}
	tenants := make([]string, 0, len(t.Busy))
	running := make([]int32, 0, len(t.Busy))
	for id, n := range t.Busy {
		tenants = append(tenants, id)
		running = append(running, int32(n))
	}
	rows, err := q.db.Query(ctx, takeDueWaitsSQL,
		t.Limit, t.Lease.Seconds(), WaitFirstHour.Seconds(), t.Share, tenants, running)
	if err != nil {
		return nil, 0, fmt.Errorf("take due DNS checks: %w", err)
	}
	stale := 0
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DueWait, error) {
		var w DueWait
		err := r.Scan(&w.ID, &w.TenantID, &w.Domain, &w.Since, &w.Paced, &w.Answer, &stale)
		return w, err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("take due DNS checks: %w", err)
	}
	return out, stale, nil
}

// recheckWaitSQL schedules the next check and, when $6, records the check in the
// domain's history while it still waits (a repeat of its wait: counted up).
var recheckWaitSQL = `
UPDATE certworker_dns_state
SET next_check_at = now() + make_interval(secs => CASE WHEN seen_at > now() - make_interval(secs => $5::float8)
                                                      THEN LEAST($2::float8, $4::float8) ELSE $2::float8 END),
    taken_until = NULL, answer = $3, updated_at = now()
WHERE domain_id = $1::uuid AND next_check_at IS NOT NULL
RETURNING (SELECT ` + eventSQL("d", "'waiting_for_dns'", reasonSQL("d"), "d.ssl_error") + ` FROM proxy_domains d
           WHERE $6 AND d.id = $1::uuid AND ` + claimableAsSQL("d") + ` AND d.ssl_held = '` + HeldDNS + `'
             AND d.ssl_error LIKE 'waiting for DNS:%')`

var recheckErrorSQL = `
UPDATE proxy_domains SET ssl_error = $2, updated_at = now()
WHERE id = $1::uuid AND ` + claimableSQL + ` AND ssl_held = '` + HeldDNS + `'
  AND ssl_error LIKE 'waiting for DNS:%' AND ssl_error IS DISTINCT FROM $2
RETURNING ` + eventSQL("proxy_domains", "'waiting_for_dns'", reasonSQL("proxy_domains"), "ssl_error")

// Recheck schedules a waiting domain's next check in checkIn, or in seenIn when that
// is sooner and a TLS handshake for the name was reported (certworker_name_seen) in
// the last WaitSeenFor, also while this check ran; with the answer seen. msg, when
// not "", replaces its ssl_error, only when that changed and only while it still
// waits (a retry or a claim meanwhile wins). Each check is a waiting_for_dns event in
// the domain's history, written with whichever write records it: the new ssl_error,
// or else the next check.
func (q *Queue) Recheck(ctx context.Context, id string, checkIn, seenIn time.Duration, answer, msg string) error {
	changed := false
	if msg != "" {
		tag, err := q.db.Exec(ctx, recheckErrorSQL, id, q.errorText(ctx, msg))
		if err != nil {
			return fmt.Errorf("record what the DNS check saw: %w", err)
		}
		changed = tag.RowsAffected() > 0
	}
	if _, err := q.db.Exec(ctx, recheckWaitSQL, id, checkIn.Seconds(), answer, seenIn.Seconds(), WaitSeenFor.Seconds(), !changed); err != nil {
		return fmt.Errorf("schedule the next DNS check: %w", err)
	}
	return nil
}

var endWaitDomainSQL = `
UPDATE proxy_domains SET ssl_held = '` + HeldBackoff + `'
WHERE id = $1::uuid AND ` + claimableSQL + ` AND ssl_held = '` + HeldDNS + `'`

var endWaitStateSQL = `
UPDATE certworker_dns_state SET next_check_at = NULL, taken_until = NULL, updated_at = now()
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
UPDATE certworker_dns_state SET next_check_at = NULL, taken_until = NULL, waiting_since = NULL, paced_since = NULL,
    updated_at = now()
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
