package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// A second CA (CONTRACT.md §5; docs/cas.md, "A second CA"). With Config.Fallback set,
// the claim decides for each row which CA its order goes to, in the statement that
// takes the row, and records the decision on it (ssl_ca_directory, ssl_ca_cause): every
// instance reads one decision, and a domain is never ordered at both CAs at once.
//
// The first CA (the worker's directory) is asked, unless:
//   - it refused the name for good before (ssl_ca_refused: caa, rejectedIdentifier,
//     unsupportedIdentifier): the second, at once (FallbackRefused); when the second
//     refused it, the first only, whatever holds it back;
//   - a pause of the first holds the row back (its outage, a rate limit, the ledger),
//     and has held it for longer than Fallback.After, measured from the later of when
//     the row fell due and when the hold began (FallbackOutage, FallbackRateLimit,
//     FallbackLedger);
//   - the stored certificate is the second's and a pause of the first holds the row
//     back at all: it is renewed where it was issued (FallbackRenewal). A certificate
//     of the second's is renewed by the first whenever the first is free, which brings
//     the fleet back to its primary.
//
// A row the second CA's own pauses hold back waits, as does one held back at the first
// for less than After. A validation failure sends nothing anywhere else: it is charged
// to the domain, and retried at whichever CA the next claim picks (the first, unless
// it is held back). Pauses are kept per CA (certworker_pauses.directory; '' is the
// first's, written before migration 00017): nothing one CA says holds a domain back at
// the other.

// Why a claim went to the second CA (ssl_ca_cause; the label of
// certworker_fallback_decisions_total).
const (
	// FallbackOutage: the first CA's outage pause (unreachable, 5xx) held the domain
	// back for longer than --acme-fallback-after.
	FallbackOutage = "outage"
	// FallbackRateLimit: a rate-limit pause of the first CA did.
	FallbackRateLimit = "rate_limit"
	// FallbackLedger: the ledger's pause of the first CA did.
	FallbackLedger = "ledger"
	// FallbackRefused: the first CA refused the name for good (caa,
	// rejectedIdentifier, unsupportedIdentifier).
	FallbackRefused = "refused"
	// FallbackRenewal: the certificate is the second CA's, and the first is held back.
	FallbackRenewal = "renewal"
)

// DefaultFallbackAfter is --acme-fallback-after: long enough that a CA's hiccup (a
// deploy, a few 5xx) or a rate limit that lifts within minutes does not spread a
// fleet's domains over two CAs, short enough that a tenant who just clicked "verify"
// is not kept waiting through a real outage.
const DefaultFallbackAfter = 10 * time.Minute

// Fallback is the second CA as the claim sees it.
type Fallback struct {
	// Directory is the second CA's ACME directory URL.
	Directory string
	// After is how long a domain may be held back at the first CA before the second
	// is asked (DefaultFallbackAfter when 0).
	After time.Duration
}

// Verdict says which CAs may be asked for a name, by directory (CAA, RFC 8659; the
// worker's). A nil Verdict allows every CA.
type Verdict func(directory string) bool

// Allows reports whether v allows the CA at directory.
func (v Verdict) Allows(directory string) bool { return v == nil || v(directory) }

// Decision is where a claim's order goes.
type Decision struct {
	// Directory is the CA to order from; "" when none is asked now (Wait says why).
	Directory string
	// Cause is why it is the second CA (Fallback*), or "" for the first.
	Cause string
	// Wait: no CA may be asked now, but the first may be later (CAA forbids the
	// second, and the first is held back): the claim goes back uncharged. With
	// Directory "" and Wait false, no CA may ever be asked: the domain fails.
	Wait bool
}

// Decide is where the worker sends claim c's order, whose CA the claim chose
// (c.Directory, c.FallbackCause), given what CAA allows (allowed) and whether the
// first CA has just refused the name for good (refused). primary is the first CA's
// directory; fb the second, nil for none. A CA that CAA forbids, or that refused the
// name, is never asked: the other is, if it may be, at once; when both may not, the
// domain fails. A claim sent to the second for a hold of the first waits for the
// first when CAA forbids the second.
func Decide(c Claim, primary string, fb *Fallback, refused bool, allowed Verdict) Decision {
	firstOK := !refused && allowed.Allows(primary)
	if fb == nil {
		if !firstOK {
			return Decision{}
		}
		return Decision{Directory: primary}
	}
	secondOK := allowed.Allows(fb.Directory)
	if c.Directory == fb.Directory {
		firstOK = firstOK && c.FallbackCause != FallbackRefused
		switch {
		case secondOK:
			return Decision{Directory: fb.Directory, Cause: c.FallbackCause}
		case firstOK:
			return Decision{Wait: true}
		}
		return Decision{}
	}
	switch {
	case firstOK:
		return Decision{Directory: primary}
	case secondOK:
		return Decision{Directory: fb.Directory, Cause: FallbackRefused}
	}
	return Decision{}
}

// claimRoute is what the claim statement (claimSQLWith) splices in to decide, for each
// row, which CA its order goes to. Without a second CA it is the first's pauses alone
// (unrouted); with one, routed.
type claimRoute struct {
	// join follows "FROM proxy_domains d" in the due CTE.
	join string
	// free is the condition that the row is not held back at the CA it goes to.
	free string
	// due are the due CTE's columns after d.id.
	due string
	// set are the claim UPDATE's assignments after its own, with a leading comma.
	set string
	// returning are RETURNING's columns after its own, with a leading comma.
	returning string
	// decision is the final SELECT's three columns: the directory, the cause, and
	// the CA that refused the name.
	decision string
}

// pauseOfFirstSQL matches a pause p in force of the first CA ($7) that holds row d
// back: the CA's own, or its pause of d's registered domain or name.
var pauseOfFirstSQL = `p.paused_until > now()
  AND ((p.scope = 'ca' AND p.key = $7)
    OR (p.scope IN ('registered_domain', 'domain') AND p.directory IN ($7, '')
        AND p.key = ANY (certworker_suffixes(d.domain))
        AND (p.scope = 'registered_domain' OR p.key = lower(d.domain))))
  AND NOT ` + ledgerExemptSQL("p", "d", "$7")

// routeCauseSQL is, for row d, why the routed claim sends it to the second CA ($8,
// asked after $9 seconds: Fallback.After), NULL for the first ($7), or 'held' for
// neither now (the package comment above). hp is the first CA's hold on the row that
// began first, with when it began for this row: the later of the row's due time and
// the pause's held_since. Every lookup is one probe of certworker_pauses (or of
// proxy_certificates, for a renewal held back at the first), made only for the rows
// the claim reads: a scalar subquery of the row, so that the claim stays one index
// scan that stops at its LIMIT (as a join, the planner routed every due row before
// sorting: 75 times slower at 10,000 due rows, BenchmarkClaimRouted).
var routeCauseSQL = `(SELECT CASE
        WHEN d.ssl_ca_refused = $7 THEN CASE WHEN ` + heldAtSecondSQL + ` THEN 'held' ELSE '` + FallbackRefused + `' END
        WHEN hp.source IS NULL THEN NULL
        WHEN d.ssl_ca_refused = $8 THEN 'held'
        WHEN hp.since >= now() - make_interval(secs => $9)
             AND NOT EXISTS (SELECT 1 FROM proxy_certificates c
                             WHERE c.domain = d.domain AND c.issuer_directory = $8) THEN 'held'
        WHEN ` + heldAtSecondSQL + ` THEN 'held'
        WHEN hp.since >= now() - make_interval(secs => $9) THEN '` + FallbackRenewal + `'
        WHEN hp.source = 'unreachable' THEN '` + FallbackOutage + `'
        WHEN hp.source = 'rate_limit' THEN '` + FallbackRateLimit + `'
        ELSE '` + FallbackLedger + `'
    END
    FROM (SELECT 1) AS one
    LEFT JOIN LATERAL (
        SELECT p.source, GREATEST(d.ssl_queued_at,
                                  d.ssl_last_attempt_at + make_interval(secs => ` + backoffSQL("d.ssl_attempts", "$2", "$3") + `),
                                  COALESCE(p.held_since, p.created_at)) AS since
        FROM certworker_pauses p
        WHERE ` + pauseOfFirstSQL + `
        ORDER BY 2 LIMIT 1) hp ON true)`

// heldAtSecondSQL: a pause in force of the second CA ($8) holds row d back.
var heldAtSecondSQL = `EXISTS (SELECT 1 FROM certworker_pauses p
        WHERE p.paused_until > now() AND p.directory = $8 AND NOT ` + ledgerExemptSQL("p", "d", "$8") + `
          AND ((p.scope = 'ca' AND p.key = $8)
            OR (p.scope IN ('registered_domain', 'domain')
                AND p.key = ANY (certworker_suffixes(d.domain))
                AND (p.scope = 'registered_domain' OR p.key = lower(d.domain)))))`

// routedClaim is the claim of a fleet with a second CA: routeCauseSQL decides, the
// row's decision is recorded with the claim.
var routedClaim = claimRoute{
	free:      routeCauseSQL + ` IS DISTINCT FROM 'held'`,
	due:       `, ` + routeCauseSQL + ` AS cause`,
	set:       `, ssl_ca_directory = CASE WHEN due.cause IS NULL THEN $7 ELSE $8 END, ssl_ca_cause = due.cause`,
	returning: `, d.ssl_ca_directory, d.ssl_ca_cause, d.ssl_ca_refused`,
	decision:  `c.ssl_ca_directory, COALESCE(c.ssl_ca_cause, ''), COALESCE(c.ssl_ca_refused, '')`,
}

// claimRoutedSQL is the claim of a fleet with a second CA (Config.Fallback): one
// statement decides for each row which CA its order goes to, and which CA's pauses
// hold it back (routeCauseSQL). It takes rows of tiers $10 to $11 in order of service
// (claimOrderSQL) from the rows in line, as claimSQL does, and takes nothing out of
// line: a row held back at the first CA may go to the second once it has waited
// --acme-fallback-after, which only a claim reading it can tell (with a second CA,
// ReturnHeld holds rows out for their backoff only, never for a pause). Its cost follows the
// rows held back ahead of the due ones, as the one-CA claim's did before it took them
// out of line (bench/claim-routed.txt). Its columns are claimSQL's.
var claimRoutedSQL = claimSQLWith(routedClaim)

func claimSQLWith(r claimRoute) string {
	return `
WITH due AS (
    SELECT d.id` + r.due + `
    FROM proxy_domains d` + r.join + `
    WHERE d.verification_status = 'verified'
      AND d.ssl_provider = 'acme'
      AND d.ssl_status = 'pending'
      AND d.ssl_held IS NULL
      AND d.ssl_attempts < $1
      AND COALESCE(d.ssl_queue_tier, 2) BETWEEN $10 AND $11
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
        d.ssl_claim_prev_attempt_at, d.ssl_queued_at, d.ssl_queue_tier, d.ssl_queue_seq,
        d.ssl_profile, d.ssl_profile_refused` + r.returning + `
)
SELECT c.id::text, c.tenant_id::text, c.domain, c.ssl_attempts, c.ssl_claim_token::text, c.ssl_last_attempt_at,
    GREATEST(c.ssl_queued_at,
             c.ssl_claim_prev_attempt_at + make_interval(secs => ` + backoffSQL("c.ssl_attempts", "$2", "$3") + `)),
    COALESCE((SELECT p.certificate_pem FROM proxy_certificates p WHERE p.domain = c.domain), ''),
    c.ssl_profile, COALESCE(c.ssl_profile_refused, ''),
    COALESCE((SELECT p.profile FROM proxy_certificates p WHERE p.domain = c.domain), ''),
    COALESCE(c.ssl_queue_tier, 2) = 2,
    ` + r.decision + `,
    COALESCE((SELECT p.issuer_directory FROM proxy_certificates p WHERE p.domain = c.domain), ''),
    0::bigint, 0::bigint
FROM claimed c
ORDER BY COALESCE(c.ssl_queue_tier, 2), COALESCE(c.ssl_queue_seq, 0), c.ssl_queued_at DESC NULLS LAST`
}

// fallbackArgs are the routed claim's parameters after claimSQL's seven.
func (f *Fallback) args() []any {
	after := f.After
	if after <= 0 {
		after = DefaultFallbackAfter
	}
	return []any{f.Directory, seconds(after)}
}

// nextDueFallbackSQL is, in NextDue, the moment a row held back at the first CA ($4)
// may next go to the second ($6 seconds after its hold began): the earliest hold of
// the first still in force, plus After. A row that fell due later goes later, which
// the worker's idle retries find.
const nextDueFallbackSQL = `(SELECT min(COALESCE(held_since, created_at)) + make_interval(secs => $6)
    FROM certworker_pauses
    WHERE paused_until > now() AND (directory IN ($4, '') OR (scope = 'ca' AND key = $4)))`

// RecordRefused records, under claim c, that the CA at directory refused c's name for
// good: from now on its orders go to the second CA at once. The claim stays held (the
// worker hands it back, uncharged, for the next claim to route).
func (q *Queue) RecordRefused(ctx context.Context, c Claim, directory string) error {
	var one int
	err := q.db.QueryRow(ctx, `
UPDATE proxy_domains SET ssl_ca_refused = $3
WHERE `+heldSQL+`
RETURNING 1`, c.ID, c.Token, directory).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return q.whyNotHeld(ctx, c)
	}
	if err != nil {
		return fmt.Errorf("record the CA's refusal: %w", err)
	}
	return nil
}

// RedirectClaim records, under claim c, that its order goes to directory for cause
// (Decide's decision, when CAA overrides the claim's).
func (q *Queue) RedirectClaim(ctx context.Context, c Claim, d Decision) error {
	var one int
	err := q.db.QueryRow(ctx, `
UPDATE proxy_domains SET ssl_ca_directory = $3, ssl_ca_cause = NULLIF($4, '')
WHERE `+heldSQL+`
RETURNING 1`, c.ID, c.Token, d.Directory, d.Cause).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return q.whyNotHeld(ctx, c)
	}
	if err != nil {
		return fmt.Errorf("record the claim's CA: %w", err)
	}
	return nil
}

// CAShort is a directory for logs and metrics' sake: "primary" or "fallback".
func CAShort(directory, primary string) string {
	if directory == "" || strings.EqualFold(directory, primary) {
		return "primary"
	}
	return "fallback"
}
