package queue

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/certworker/certworker/queue/issuing"
)

// claimSQL claims up to $6 due domains of the tiers $8 to $9 in one statement.
//
// FOR UPDATE SKIP LOCKED inside the statement that flips the status is what makes
// several instances safe: two cannot claim the same row, and neither blocks on the
// other. The statement is the one judge of what is due; a wake-up only says "look now".
//
// Due: verified, acme, pending, attempts below the limit, backoff elapsed, and not
// held back by a pause. The backoff is computed here, from the row's own ssl_attempts,
// with the same parameters as Config.Backoff: it has to be one statement. The
// reference's first version claimed the row (stamping ssl_last_attempt_at) and checked
// the backoff in a second query, against the timestamp it had just overwritten, so
// every row with a failure behind it looked just tried and backoff meant "never retry".
//
// The claim reads only what it can take, so that a claim costs what it takes, not
// the queue's length nor the rows held back. It reads the rows in line, in
// order of service, from proxy_domains_line_idx, and locks them as it reads (FOR
// UPDATE SKIP LOCKED: a row another instance is claiming is passed over, not counted):
// the worker's failure write takes a row out of line (ssl_held), and ReturnHeld brings
// it back once its backoff has run out. It reads at most $10 of them (head, as many as
// it may claim when the queue is in order): a row in line that the pause of a
// registered domain or of its name holds back, or whose backoff has not run out (a
// longer --retry-base, a hand edit), is taken out of line by the same statement (out),
// so that no later claim reads it again, and Claim reads on with a wider window. A
// pause of the CA ($7) is one test for the whole statement, and takes nothing out. Of
// two rows whose names differ only in case, only the one that keeps the name
// (keepsNameSQL, twins.go) is claimed: the other is failed by the same statement
// (lost), so that it never holds the keeper back and is not read again. Pauses are conditions of the claim, not checks after
// it, so a held-back domain is never claimed and handed back again.
//
// Order of service (CONTRACT.md §5):
//  1. ssl_queue_tier 1, renewals close to expiry (a fifth of the lifetime left, or
//     past the CA's renewal window): a certificate about to expire hurts a tenant
//     who is already served, and waiting behind a backlog could let it lapse.
//     Tenants take turns here too: ssl_queue_seq is a turn of the row's tenant, and
//     the claim serves each turn with that tenant's due urgent renewal of earliest
//     ssl_renew_by (picks), handing the turn's place to the row it did not take
//     (moved), so that a tenant with 500 urgent renewals gets one a round, earliest
//     expiry first;
//  2. tier 2, first issuances and retries, shared between tenants: ssl_queue_seq is
//     the row's place in its tenant's line, one past the tenant's last place in the
//     tier and never before the tier's clock, the first place in line in that tier
//     (the wake trigger, migration 00015), so a tenant with 2,000 rows queued gets
//     one turn a round, and a tenant that verifies one domain later is served in
//     the next round, not after the 2,000; on a tied place, the row queued last goes
//     first, the tenant who has just arrived;
//  3. tier 3, renewals with time to spare: they can wait behind a tenant's first
//     certificate, and become tier 1 when their time runs short.
//
// Within a tenant, its rows are served in the order they entered the queue (tier 1:
// earliest expiry), so the oldest attempt first and a retry behind the rows queued
// before its failure. Each tier's clock follows only that tier, and nothing writes it:
// it is read from the index (the claim of old moved one clock row for every tier, so
// one urgent renewal of a tenant with a backlog put a newcomer behind it).
//
// The claim stamps ssl_last_attempt_at and updated_at with the transaction's time, as
// the reference does, and keeps the previous attempt time in ssl_claim_prev_attempt_at
// for a hand-back. It returns the claims in order of service, and one row at least:
// the rows it took out of line and the rows it read, for Claim to know whether to
// read on.
var claimSQL = `
WITH head AS MATERIALIZED (
    SELECT h.*, row_number() OVER () AS rn FROM (
        SELECT d.id, d.tenant_id, COALESCE(d.ssl_queue_tier, 2) AS tier, COALESCE(d.ssl_queue_seq, 0) AS seq,
            ` + readySQL("d") + ` AS ready, ` + heldByPauseSQL("d", "$7") + ` AS pause, ` + keepsNameSQL("d") + ` AS keeps
        FROM proxy_domains d
        WHERE ` + inLineSQL + `
          AND COALESCE(d.ssl_queue_tier, 2) BETWEEN $8 AND $9
          AND d.ssl_attempts < $1
          AND NOT EXISTS (SELECT 1 FROM certworker_pauses
                          WHERE scope = 'ca' AND key = $7 AND paused_until > now() AND source <> 'ledger')
        ` + claimOrderSQL + `
        LIMIT $10
        FOR UPDATE OF d SKIP LOCKED) h
), due AS (
    SELECT id, tenant_id, tier, seq, rn FROM head
    WHERE ready AND pause IS NULL AND keeps
    ORDER BY rn
    LIMIT $6
), turns AS (
    SELECT tenant_id, count(*) AS k FROM due WHERE tier = 1 GROUP BY tenant_id
), picks AS (
    SELECT e.id, e.tenant_id, e.seq, row_number() OVER (PARTITION BY e.tenant_id ORDER BY e.renew_by, e.id) AS r
    FROM turns t CROSS JOIN LATERAL (
        SELECT x.id, x.tenant_id, COALESCE(x.ssl_queue_seq, 0) AS seq, x.ssl_renew_by AS renew_by
        FROM proxy_domains x
        WHERE x.tenant_id = t.tenant_id AND x.ssl_queue_tier = 1
          AND x.verification_status = 'verified' AND x.ssl_provider = 'acme' AND x.ssl_status = 'pending'
          AND x.ssl_held IS NULL AND x.ssl_attempts < $1 AND ` + readySQL("x") + `
          AND ` + heldByPauseSQL("x", "$7") + ` IS NULL
          AND ` + keepsNameSQL("x") + `
        ORDER BY x.ssl_renew_by, x.id
        LIMIT t.k
        FOR UPDATE OF x SKIP LOCKED) e
), take AS (
    SELECT id, rn FROM due WHERE tier <> 1
    UNION ALL
    SELECT p.id, u.rn
    FROM picks p
    JOIN (SELECT tenant_id, rn, row_number() OVER (PARTITION BY tenant_id ORDER BY rn) AS r
          FROM due WHERE tier = 1) u ON u.tenant_id = p.tenant_id AND u.r = p.r
), moved AS (
    UPDATE proxy_domains d SET ssl_queue_seq = m.seq
    FROM (SELECT a.id, b.seq
          FROM (SELECT id, tenant_id, row_number() OVER (PARTITION BY tenant_id ORDER BY seq, id) AS r
                FROM due WHERE tier = 1 AND id NOT IN (SELECT id FROM picks)) a
          JOIN (SELECT tenant_id, seq, row_number() OVER (PARTITION BY tenant_id ORDER BY seq, id) AS r
                FROM picks WHERE id NOT IN (SELECT id FROM due)) b
            ON a.tenant_id = b.tenant_id AND a.r = b.r) m
    WHERE d.id = m.id
), out AS (
    UPDATE proxy_domains d SET ssl_held = COALESCE(h.pause, '` + HeldBackoff + `')
    FROM head h WHERE d.id = h.id AND h.keeps AND (NOT h.ready OR h.pause IS NOT NULL)
    RETURNING d.id
` + claimTailSQL("take", false)

// claimWindow is how many rows in line one claim statement reads for n slots: n at
// first, since the rows it reads are locked as they are read and a row another
// instance holds is passed over. Each round after one that came back short reads four
// times as many, up to maxClaimWindow: rows held back meet the claim in runs (a pause
// of a registered domain holds back all its names at once), and taking them out n at
// a time would leave the queue idle behind them.
func claimWindow(n, round int) int {
	w := n
	for range round {
		w = min(4*w, maxClaimWindow)
	}
	return w
}

// maxClaimWindow bounds the rows one claim statement reads, and so what it may take
// out of line at once (a few hundred milliseconds of writes).
const maxClaimWindow = 10000

// claimRounds bounds the statements one Claim runs for one part: a claim that came
// back short reads on while it took rows out of line, or read a full window. Eight
// take out some 38,000 rows at most, a few seconds of writes, well within a step's
// timeout; a claim left short by more is followed by the worker's next pass, since
// the queue still says something is due.
const claimRounds = 8

// Claim takes up to limit due domains for owner (an instance name, for operators and
// for ReleaseUntracked), from the CA at directory (whose pause it respects). It
// returns none when nothing is due.
func (q *Queue) Claim(ctx context.Context, owner, directory string, limit int) ([]issuing.Claim, error) {
	return q.ClaimShared(ctx, owner, directory, limit, 0)
}

// ClaimShared is Claim with up to newcomers of the limit claimed first among first
// issuances and their retries (tier 2), whatever the urgent renewals ahead of them:
// the worker keeps a quarter of its slots for them while any are due (CONTRACT.md §5),
// so that a tenant who verifies during a mass revocation is served among the next
// --concurrency claims. What the newcomers leave is claimed in order of service (every
// tier: 1 to 3, and any other value ssl_queue_tier holds, which a hand edit may have
// put there, so that no row is left out of every claim). Rows held out of line whose
// time has come are brought back first (ReturnHeld).
func (q *Queue) ClaimShared(ctx context.Context, owner, directory string, limit, newcomers int) ([]issuing.Claim, error) {
	if limit <= 0 {
		return nil, nil
	}
	if _, err := q.ReturnHeld(ctx, directory); err != nil {
		return nil, err
	}
	return q.ClaimInLine(ctx, owner, directory, limit, newcomers)
}

// ClaimInLine is ClaimShared without bringing held rows back first: it claims from
// the rows in line as they stand. It is the claim of a pass woken for a row that has
// just entered the queue, which the wake trigger has put in line: bringing held rows
// back costs a statement (most of it planning) before the claim, on the path from a
// tenant's "verify" to its order, and a held row's time is known in advance
// (NextDue), so the worker's timer brings it back when it comes.
func (q *Queue) ClaimInLine(ctx context.Context, owner, directory string, limit, newcomers int) ([]issuing.Claim, error) {
	if limit <= 0 {
		return nil, nil
	}
	var claims []issuing.Claim
	if newcomers > 0 {
		got, err := q.claimTiers(ctx, owner, directory, min(newcomers, limit), 2, 2)
		if err != nil {
			return got, err
		}
		claims = got
	}
	got, err := q.claimTiers(ctx, owner, directory, limit-len(claims), math.MinInt16, math.MaxInt16)
	return append(claims, got...), err
}

// claimTiers claims up to limit due domains of tiers lo to hi, reading on while a
// statement came back short but took rows out of line or read a full window.
func (q *Queue) claimTiers(ctx context.Context, owner, directory string, limit, lo, hi int) ([]issuing.Claim, error) {
	var claims []issuing.Claim
	grow := 0
	for round := 0; round < claimRounds && len(claims) < limit; round++ {
		n := limit - len(claims)
		window := claimWindow(n, grow)
		got, takenOut, read, err := q.claimOnce(ctx, owner, directory, n, lo, hi, window)
		claims = append(claims, got...)
		if err != nil {
			return claims, err
		}
		if len(got) == n || (takenOut == 0 && read < window) {
			break
		}
		grow++
	}
	return claims, nil
}

// claimStatement is the claim statement of q's configuration (claimRoutedSQL with a
// second CA) and its arguments.
func (q *Queue) claimStatement(owner, directory string, n, lo, hi, window int) (string, []any) {
	if q.cfg.Fallback != nil {
		return claimRoutedSQL, append([]any{q.cfg.MaxAttempts, seconds(q.cfg.RetryBase), seconds(q.cfg.RetryMax),
			owner, seconds(q.cfg.Lease), n, directory}, append(fallbackArgs(q.cfg.Fallback), lo, hi, window)...)
	}
	return claimSQL, []any{q.cfg.MaxAttempts, seconds(q.cfg.RetryBase), seconds(q.cfg.RetryMax),
		owner, seconds(q.cfg.Lease), n, directory, lo, hi, window}
}

func (q *Queue) claimOnce(ctx context.Context, owner, directory string, n, lo, hi, window int) (claims []issuing.Claim, takenOut, read int, err error) {
	sql, args := q.claimStatement(owner, directory, n, lo, hi, window)
	rows, err := q.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("claim: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var c issuing.Claim
		var id, tenant, domain, token, pem, refused, certProfile, dir, cause, refusedBy, refusedCause, certDir *string
		var attempts *int
		var first *bool
		var claimedAt, due *time.Time
		if err := rows.Scan(&id, &tenant, &domain, &attempts, &token,
			&claimedAt, &due, &pem, &c.Profile, &refused, &certProfile, &first,
			&dir, &cause, &refusedBy, &refusedCause, &certDir, &takenOut, &read); err != nil {
			return nil, 0, 0, fmt.Errorf("claim: %w", err)
		}
		if id == nil {
			continue // nothing claimed: the counts only
		}
		c.ID, c.TenantID, c.Domain, c.Attempts, c.Token, c.ClaimedAt = *id, *tenant, *domain, *attempts, *token, *claimedAt
		c.CurrentPEM, c.ProfileRefused, c.CertProfile = deref(pem), deref(refused), deref(certProfile)
		c.FirstIssuance = first != nil && *first
		c.Directory, c.FallbackCause, c.RefusedBy, c.CertDirectory = deref(dir), deref(cause), deref(refusedBy), deref(certDir)
		c.RefusedCause = deref(refusedCause)
		if due != nil {
			c.DueAt = *due
		}
		claims = append(claims, c)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, 0, fmt.Errorf("claim: %w", err)
	}
	return claims, takenOut, read, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// ReturnHeld brings back in line the rows held out whose time has come (for the CA at
// directory, whose ledger's pauses some rows pass), and returns how many: a row held for its backoff once the backoff by the current formula
// (CONTRACT.md §5: --retry-base, --retry-max, from its own ssl_attempts) has run out,
// and a row held under a pause once that pause has ended; a row still held back for
// the other reason is held for that one instead. So a changed --retry-base, a hand
// edit of ssl_attempts or ssl_last_attempt_at, or a pause lifted early takes effect at
// the next claim.
//
// Like NextDue it reads per attempt count (below --max-attempts) the rows never tried
// and those tried before that count's backoff, two index ranges of
// proxy_domains_held_backoff_idx, and the pauses rows are held under once each (a
// skip scan of proxy_domains_held_pause_idx): its cost follows the rows it brings
// back, not the rows held. Rows locked by someone else (the proxy's open transaction) are
// skipped and left for the next call; no more than fillBatch rows a call. The rows
// are looked up by id (= ANY of an array: the primary key, whatever the statistics
// say): as a semi-join, after a mass hold and before the next analyze, the planner
// counted one held row and read all 100,000 to match them with the candidates (1.9 s
// instead of 0.2 ms, bench/plans.txt). A row back
// in line takes its place as a row entering the queue does (the wake trigger): one
// past its tenant's last in its tier, and never before the tier's clock; its tenant's
// rows coming back together take consecutive places.
func (q *Queue) ReturnHeld(ctx context.Context, directory string) (int64, error) {
	// Query, not Exec: pgx sends a statement without arguments through Exec in the
	// simple protocol, unprepared and planned at every call.
	rows, err := q.db.Query(ctx, q.returnHeldStatement(directory))
	if err != nil {
		return 0, fmt.Errorf("bring held rows back in line: %w", err)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("bring held rows back in line: %w", err)
	}
	return rows.CommandTag().RowsAffected(), nil
}

// returnHeldStatement is ReturnHeld's statement for the CA at directory. It has no
// parameters: --max-attempts, --retry-base, --retry-max, the batch and the directory
// are written into it as literals. With them as parameters the server planned it
// anew at every call (a custom plan each time: it never preferred the generic one),
// 3-4 ms of planning on a warm session and 10-28 ms on the wake benchmark's, for
// 0.03 ms of execution (pg_stat_statements: 13 plans in 12 calls). A statement
// without parameters is planned once per session, and WarmUp plans it before the
// session's first claim. Each is a setting of the process, and the same for every
// call, so the statement is too, and one entry of the statement cache.
func (q *Queue) returnHeldStatement(directory string) string {
	maxAttempts, batch := strconv.Itoa(q.cfg.MaxAttempts), strconv.Itoa(fillBatch)
	float := func(d time.Duration) string { return strconv.FormatFloat(seconds(d), 'g', -1, 64) + "::float8" }
	base, cap := float(q.cfg.RetryBase), float(q.cfg.RetryMax)
	dir, _ := sqlLiterals([]any{directory}) // a string always has one
	// With a second CA a row held back at the first is not held out of line: it
	// may go to the second once it has waited (claimRoutedSQL).
	pause := heldByPauseSQL("d", dir+"::text")
	// A row held under a pause comes back once the pause has ended; with a second CA,
	// at once, whatever holds it (the routed claim holds rows out as HeldRouted, and a
	// row held under a pause's key was held out by a claim of one CA: a fleet that
	// now has a second).
	pauseEnded := `AND ` + pauseOverSQL("keys.k")
	if q.cfg.Fallback != nil {
		pause, pauseEnded = "NULL::text", ""
	}
	return `
WITH RECURSIVE ` + heldKeysSQL("keys") + `, cand AS (
    SELECT r.id FROM generate_series(0, ` + maxAttempts + ` - 1) AS k
    CROSS JOIN LATERAL (
        (SELECT id FROM proxy_domains
         WHERE ` + claimableSQL + ` AND ssl_held = '` + HeldBackoff + `' AND ssl_attempts = k AND ssl_last_attempt_at IS NULL
         LIMIT ` + batch + `)
        UNION ALL
        (SELECT id FROM proxy_domains
         WHERE ` + claimableSQL + ` AND ssl_held = '` + HeldBackoff + `' AND ssl_attempts = k
           AND ssl_last_attempt_at < now() - make_interval(secs => ` + backoffSQL("k", base, cap) + `)
         ORDER BY ssl_last_attempt_at LIMIT ` + batch + `)) r
    UNION ALL
    (SELECT id FROM proxy_domains d
     WHERE ` + claimableSQL + ` AND ssl_held = '` + HeldBackoff + `' AND ssl_attempts < 0 AND ` + readyAtSQL("d", base, cap) + `
     LIMIT ` + batch + `)
    UNION ALL
    SELECT r.id FROM keys
    CROSS JOIN LATERAL (
        SELECT id FROM proxy_domains
        WHERE ` + claimableSQL + ` AND ssl_held = keys.k
        LIMIT ` + batch + `) r
    WHERE keys.k IS NOT NULL AND keys.k NOT IN ('` + HeldDNS + `', '` + HeldRouted + `') ` + pauseEnded + `
    UNION ALL
    (SELECT id FROM proxy_domains
     WHERE ` + claimableSQL + ` AND ssl_held = '` + HeldRouted + `' AND ssl_held_until <= now()
     ORDER BY ssl_held_until LIMIT ` + batch + `)
    UNION ALL
    (SELECT id FROM proxy_domains
     WHERE ` + claimableSQL + ` AND ssl_held = '` + HeldRouted + `'
       AND NOT EXISTS (SELECT 1 FROM certworker_pauses WHERE paused_until > now())
     LIMIT ` + batch + `)
    UNION ALL
    (SELECT id FROM proxy_domains
     WHERE ` + claimableSQL + ` AND ssl_held = '` + HeldDNS + `'
       AND (ssl_error IS NULL OR ssl_error NOT LIKE 'waiting for DNS:%')
     LIMIT ` + batch + `)
), locked AS (
    SELECT d.id, d.tenant_id, COALESCE(d.ssl_queue_tier, 2) AS tier, COALESCE(d.ssl_queue_seq, 0) AS seq,
        ` + readyAtSQL("d", base, cap) + ` AS ready, ` + pause + ` AS pause
    FROM proxy_domains d
    WHERE d.id = ANY (ARRAY(SELECT id FROM cand LIMIT ` + batch + `))
      AND ` + claimableSQL + ` AND d.ssl_held IS NOT NULL
    FOR UPDATE OF d SKIP LOCKED
), placed AS (
    SELECT l.id, l.ready, l.pause,
        LEAST(` + placeSQL("l.tenant_id", "l.tier") + `::numeric
              + row_number() OVER (PARTITION BY l.tenant_id, l.tier, (l.ready AND l.pause IS NULL) ORDER BY l.seq, l.id) - 1,
              ` + maxPlaceSQL + `)::bigint AS seq
    FROM locked l
)
UPDATE proxy_domains d SET
    ssl_held = CASE WHEN p.pause IS NOT NULL THEN p.pause WHEN NOT p.ready THEN '` + HeldBackoff + `' END,
    ssl_held_until = NULL,
    ssl_queue_seq = CASE WHEN p.ready AND p.pause IS NULL THEN p.seq ELSE d.ssl_queue_seq END
FROM placed p
WHERE d.id = p.id AND d.ssl_held IS DISTINCT FROM
    CASE WHEN p.pause IS NOT NULL THEN p.pause WHEN NOT p.ready THEN '` + HeldBackoff + `' END`
}

// Untracked is a claim handed back by ReleaseUntracked.
type Untracked struct {
	ID, TenantID, Domain string
}

var releaseUntrackedSQL = `
UPDATE proxy_domains SET
    ssl_status = 'pending', ssl_last_attempt_at = ssl_claim_prev_attempt_at, updated_at = now(),
    ` + releaseClaimSQL + `
WHERE ssl_status = 'provisioning' AND ssl_claimed_by = $1
  AND NOT (ssl_claim_token = ANY($2::uuid[]))
RETURNING id::text, tenant_id::text, domain`

// ReleaseUntracked hands back, uncharged, every row owner holds whose token is not in
// keep: claims whose statement committed but whose answer never reached the instance
// (a timeout, a lost connection). Without it such rows would sit in 'provisioning'
// under a live instance's name until their lease ran out, and then be reclaimed with
// an attempt charged for an order that was never placed. owner must name one instance
// only (the worker adds a random suffix to the name it is given).
func (q *Queue) ReleaseUntracked(ctx context.Context, owner string, keep []string) ([]Untracked, error) {
	rows, err := q.db.Query(ctx, releaseUntrackedSQL, owner, keep)
	if err != nil {
		return nil, fmt.Errorf("release untracked claims: %w", err)
	}
	defer rows.Close()
	var out []Untracked
	for rows.Next() {
		var u Untracked
		if err := rows.Scan(&u.ID, &u.TenantID, &u.Domain); err != nil {
			return nil, fmt.Errorf("release untracked claims: %w", err)
		}
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("release untracked claims: %w", err)
	}
	return out, nil
}
