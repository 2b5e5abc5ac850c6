package queue

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/certworker/certworker/queue/issuing"
)

// claimSQL claims up to $6 due domains of the tiers $8 to $9 in one statement, the
// one judge of what is due (docs/internals.md, Claim and Order of service). FOR
// UPDATE SKIP LOCKED lets instances claim side by side without blocking.
//
// It reads at most $10 rows in line, in order of service, locking as it reads. A row
// held back by a pause or its backoff it takes out of line (out), a twin that loses
// its name it fails (lost), so no later claim reads either again. Tier 1 serves each
// tenant's turn with its earliest due renewal (picks), handing the turn's place to
// the row it did not take (moved). The previous attempt time is kept for a hand-back,
// and the counts Claim reads on by come back in one row at least.
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

// claimWindow is how many rows in line one claim statement reads for n slots: n,
// then four times as many after each short round, up to maxClaimWindow: held-back
// rows come in runs.
func claimWindow(n, round int) int {
	w := n
	for range round {
		w = min(4*w, maxClaimWindow)
	}
	return w
}

// maxClaimWindow bounds the rows one claim statement reads and may take out of line.
const maxClaimWindow = 10000

// claimRounds bounds the statements one Claim runs for one part, within a step's
// timeout; the worker's next pass takes what is left.
const claimRounds = 8

// Claim takes up to limit due domains for owner (an instance name), from the CA at
// directory, whose pause it respects. It returns none when nothing is due.
func (q *Queue) Claim(ctx context.Context, owner, directory string, limit int) ([]issuing.Claim, error) {
	return q.ClaimShared(ctx, owner, directory, limit, 0)
}

// ClaimShared is Claim with up to newcomers of the limit taken first from tier 2,
// whatever is ahead; the rest in order of service, over every tier value. Held rows
// whose time has come are brought back first (ReturnHeld).
func (q *Queue) ClaimShared(ctx context.Context, owner, directory string, limit, newcomers int) ([]issuing.Claim, error) {
	if limit <= 0 {
		return nil, nil
	}
	if _, err := q.ReturnHeld(ctx, directory); err != nil {
		return nil, err
	}
	return q.ClaimInLine(ctx, owner, directory, limit, newcomers)
}

// ClaimInLine is ClaimShared without ReturnHeld first: the claim of a pass woken for
// a row just put in line. The timer brings held rows back (NextDue).
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

// ReturnHeld brings back in line the rows held out whose time has come, for the CA at
// directory, and returns how many: a row whose backoff by the current formula has run
// out or whose pause has ended (a row still held for the other reason is held for
// that). Its cost follows the rows it brings back; locked rows wait for the next call.
// Rows are looked up by id = ANY(array), so the primary key is used whatever the
// statistics say, and take their place as the wake trigger would give it.
func (q *Queue) ReturnHeld(ctx context.Context, directory string) (int64, error) {
	// Query, not Exec: Exec without arguments is planned at every call.
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

// returnHeldStatement is ReturnHeld's statement for the CA at directory, with its
// settings as literals so the server plans it once per session (docs/internals.md).
func (q *Queue) returnHeldStatement(directory string) string {
	maxAttempts, batch := strconv.Itoa(q.cfg.MaxAttempts), strconv.Itoa(fillBatch)
	float := func(d time.Duration) string { return strconv.FormatFloat(seconds(d), 'g', -1, 64) + "::float8" }
	base, cap := float(q.cfg.RetryBase), float(q.cfg.RetryMax)
	dir, _ := sqlLiterals([]any{directory}) // a string always has one
	// With a second CA, a row held back at the first stays in line (claimRoutedSQL).
	pause := heldByPauseSQL("d", dir+"::text")
	// A row held under a pause comes back once the pause ends; with a second CA, at
	// once, whatever holds it.
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
// keep: claims whose answer never arrived, which the reclaim would otherwise charge.
// owner must name one instance.
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
