package queue

import (
	"context"
	"fmt"
	"time"
)

// Claim is a domain this instance has claimed and holds a lease on.
type Claim struct {
	ID       string
	TenantID string
	// Domain as stored; CheckName gives the name to order.
	Domain string
	// Attempts before this one (as stored: may be negative in a hand-edited row).
	Attempts int
	// Token identifies this claim; every write that finishes it checks the token.
	Token string
	// ClaimedAt is the claiming transaction's time.
	ClaimedAt time.Time
	// DueAt is when the row became claimable: when it entered the claimable set, or
	// when its backoff ran out, whichever is later. Zero when unknown.
	DueAt time.Time
	// CurrentPEM is the stored certificate this order renews, or "".
	CurrentPEM string
	// Profile is the domain's own ACME profile (ssl_profile), nil for --acme-profile.
	Profile *string
	// ProfileRefused is the domain's profile the CA does not offer
	// (ssl_profile_refused), or "". The worker sets it when the CA refuses the
	// profile during the order, and clears it when the order used the domain's own.
	ProfileRefused string
	// CertProfile is the profile the stored certificate was issued under, or "" when
	// none is recorded (no certificate, one issued before migration 00014, an upload).
	CertProfile string
	// Notice is what ssl_error says of the domain once its certificate is stored
	// (MarkActive), or "" for nothing: set by the worker when it renewed under the
	// certificate's profile because the CA does not offer the domain's own.
	Notice string
	// Directory is the ACME directory of the CA the order goes to, as the claim
	// decided (fallback.go); FallbackCause is why it is the second CA (Fallback*), or
	// "" for the first.
	Directory     string
	FallbackCause string
	// RefusedBy is the directory of the CA that refused the name for good
	// (ssl_ca_refused), or "".
	RefusedBy string
	// CertDirectory is the directory of the CA that issued the stored certificate, or
	// "" when none is recorded (no certificate, one stored before migration 00017, an
	// upload): the first CA's, then.
	CertDirectory string
}

// claimOrderSQL is the claim's order of service (see claimSQL).
const claimOrderSQL = `ORDER BY COALESCE(d.ssl_queue_tier, 2), COALESCE(d.ssl_queue_seq, 0), d.ssl_queued_at DESC NULLS LAST`

// claimSQL claims up to $6 due domains in one statement.
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
// Pauses (certworker_pauses) are conditions of the claim, not checks after it, so a
// held-back domain is never claimed and handed back again: a pause of the CA ($7) is
// one test for the whole statement; a pause of a registered domain or of one name is
// looked up among the row's own suffixes (certworker_suffixes), and only while such a
// pause exists at all. Two rows whose names differ only in case are never claimed:
// they are the same name to a CA, and which one the tenant meant is theirs to say.
// That test is a count, not NOT EXISTS, on purpose: the planner turns NOT EXISTS into
// an anti-join of the whole table before the ORDER BY and LIMIT, 100 times slower at
// 10,000 due rows, where a count stays one index probe of each row the claim reads.
//
// The ledger's own pauses (source 'ledger') hold back only what their limit covers
// (see ledger.go): a renewal the CA knows as one (renewalSQL) passes a pause of the
// account's orders or of its registered domain, and an ARI renewal (ariExemptSQL)
// passes every ledger pause. Those tests run only for a row under such a pause: the
// uncorrelated test before each OR is evaluated once, and the OR stops there while
// no pause exists.
//
// Order of service (CONTRACT.md §5, issue #13), read in order from
// proxy_domains_queue_idx, so that the claim's cost follows the rows it takes, not the
// queue's length (ranking every due row on each claim would not):
//  1. ssl_queue_tier 1, renewals close to expiry (a fifth of the lifetime left, or
//     past the CA's renewal window): a certificate about to expire hurts a tenant
//     who is already served, and waiting behind a backlog could let it lapse;
//  2. tier 2, first issuances and retries, shared between tenants: ssl_queue_seq is
//     the row's place in its tenant's line, drawn from the tenant's own counter and
//     never behind the place the queue is serving (migration 00005), so a tenant
//     with 2,000 rows queued gets one turn a round, and a tenant that verifies one
//     domain later is served in the next round, not after the 2,000; on a tied
//     place, the row queued last goes first, the tenant who has just arrived;
//  3. tier 3, renewals with time to spare: they can wait behind a tenant's first
//     certificate, and become tier 1 when their time runs short.
//
// Within a tenant, its rows are served in the order they entered the queue, so the
// oldest attempt first and a retry behind the rows queued before its failure.
//
// The claim stamps ssl_last_attempt_at and updated_at with the transaction's time, as
// the reference does, and keeps the previous attempt time in ssl_claim_prev_attempt_at
// for a hand-back. It moves the queue's clock to the place it served, so that a row
// queued later is never placed before it.
//
// Which CA a row goes to, and which pauses hold it back, is r's (claimRoute, in
// fallback.go): the first CA's pauses alone, or with a second CA the decision between
// the two, recorded on the row.
var claimSQL = claimSQLWith(unroutedClaim)

func claimSQLWith(r claimRoute) string {
	return `
WITH due AS (
    SELECT d.id` + r.due + `
    FROM proxy_domains d` + r.join + `
    WHERE d.verification_status = 'verified'
      AND d.ssl_provider = 'acme'
      AND d.ssl_status = 'pending'
      AND d.ssl_attempts < $1
      AND (d.ssl_last_attempt_at IS NULL
           OR d.ssl_last_attempt_at < now() - make_interval(secs => ` + backoffSQL("d.ssl_attempts", "$2", "$3") + `))
      AND ` + r.free + `
      AND (SELECT count(*) FROM proxy_domains o WHERE lower(o.domain) = lower(d.domain)) = 1
    ` + claimOrderSQL + `
    LIMIT $6
    FOR UPDATE OF d SKIP LOCKED
), claimed AS (
    UPDATE proxy_domains d SET
        ssl_status = 'provisioning',
        ssl_claim_prev_attempt_at = d.ssl_last_attempt_at,
        ssl_last_attempt_at = now(),
        updated_at = now(),
        ssl_claim_token = gen_random_uuid(),
        ssl_claimed_by = $4,
        ssl_lease_expires_at = now() + make_interval(secs => $5)` + r.set + `
    FROM due
    WHERE d.id = due.id
    RETURNING d.id, d.tenant_id, d.domain, d.ssl_attempts, d.ssl_claim_token, d.ssl_last_attempt_at,
        d.ssl_claim_prev_attempt_at, d.ssl_queued_at, d.ssl_queue_seq,
        d.ssl_profile, d.ssl_profile_refused` + r.returning + `
), clock AS (
    UPDATE certworker_queue_clock SET vtime = GREATEST(vtime, (SELECT max(ssl_queue_seq) FROM claimed))
    WHERE id AND EXISTS (SELECT 1 FROM claimed WHERE ssl_queue_seq IS NOT NULL)
)
SELECT c.id::text, c.tenant_id::text, c.domain, c.ssl_attempts, c.ssl_claim_token::text, c.ssl_last_attempt_at,
    GREATEST(c.ssl_queued_at,
             c.ssl_claim_prev_attempt_at + make_interval(secs => ` + backoffSQL("c.ssl_attempts", "$2", "$3") + `)),
    COALESCE((SELECT p.certificate_pem FROM proxy_certificates p WHERE p.domain = c.domain), ''),
    c.ssl_profile, COALESCE(c.ssl_profile_refused, ''),
    COALESCE((SELECT p.profile FROM proxy_certificates p WHERE p.domain = c.domain), ''),
    ` + r.decision + `,
    COALESCE((SELECT p.issuer_directory FROM proxy_certificates p WHERE p.domain = c.domain), '')
FROM claimed c`
}

// Claim takes up to limit due domains for owner (an instance name, for operators and
// for ReleaseUntracked), from the CA at directory (whose pause it respects), or, with
// a second CA (Config.Fallback), from whichever each row goes to (Claim.Directory).
// It returns none when nothing is due.
func (q *Queue) Claim(ctx context.Context, owner, directory string, limit int) ([]Claim, error) {
	if limit <= 0 {
		return nil, nil
	}
	sql, args := claimSQL, []any{q.cfg.MaxAttempts, seconds(q.cfg.RetryBase), seconds(q.cfg.RetryMax),
		owner, seconds(q.cfg.Lease), limit, directory}
	if q.cfg.Fallback != nil {
		sql, args = claimRoutedSQL, append(args, q.cfg.Fallback.args()...)
	}
	rows, err := q.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	defer rows.Close()
	var claims []Claim
	for rows.Next() {
		var c Claim
		var due *time.Time
		if err := rows.Scan(&c.ID, &c.TenantID, &c.Domain, &c.Attempts, &c.Token,
			&c.ClaimedAt, &due, &c.CurrentPEM, &c.Profile, &c.ProfileRefused, &c.CertProfile,
			&c.Directory, &c.FallbackCause, &c.RefusedBy, &c.CertDirectory); err != nil {
			return nil, fmt.Errorf("claim: %w", err)
		}
		if due != nil {
			c.DueAt = *due
		}
		claims = append(claims, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	return claims, nil
}

// Untracked is a claim handed back by ReleaseUntracked.
type Untracked struct {
	ID     string
	Domain string
}

// ReleaseUntracked hands back, uncharged, every row owner holds whose token is not in
// keep: claims whose statement committed but whose answer never reached the instance
// (a timeout, a lost connection). Without it such rows would sit in 'provisioning'
// under a live instance's name until their lease ran out, and then be reclaimed with
// an attempt charged for an order that was never placed. owner must name one instance
// only (the worker adds a random suffix to the name it is given).
func (q *Queue) ReleaseUntracked(ctx context.Context, owner string, keep []string) ([]Untracked, error) {
	rows, err := q.db.Query(ctx, `
UPDATE proxy_domains SET
    ssl_status = 'pending', ssl_last_attempt_at = ssl_claim_prev_attempt_at, updated_at = now(),
    `+releaseClaimSQL+`
WHERE ssl_status = 'provisioning' AND ssl_claimed_by = $1
  AND NOT (ssl_claim_token = ANY($2::uuid[]))
RETURNING id::text, domain`, owner, keep)
	if err != nil {
		return nil, fmt.Errorf("release untracked claims: %w", err)
	}
	defer rows.Close()
	var out []Untracked
	for rows.Next() {
		var u Untracked
		if err := rows.Scan(&u.ID, &u.Domain); err != nil {
			return nil, fmt.Errorf("release untracked claims: %w", err)
		}
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("release untracked claims: %w", err)
	}
	return out, nil
}
