package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

// A second CA (docs/cas.md, "A second CA", has the rules). With Config.Fallback set,
// the claim decides for each row which CA its order goes to, in the statement that
// takes the row, and records it (ssl_ca_directory, ssl_ca_cause): every instance
// reads one decision, and a domain is never ordered at both CAs at once. A certificate
// of the second's is renewed there only while the first holds the row back, which
// brings the fleet back to its primary. Pauses are per CA ('' is the first's).

// routeSQL is, for row d of the routed claim's head, a lateral subquery of two
// columns: cause, why the row goes to the second CA ($8, after $9 seconds), NULL for
// the first ($7), or 'held' for neither now; and until, for a held row, the first
// future moment that can change. hp is the first CA's earliest hold on the row, from
// the latest of ssl_waiting_since, its backoff's end and held_since; sp the end of
// the second's pauses. Each lookup is one index probe.
var routeSQL = `SELECT CASE
        WHEN d.ssl_ca_refused = $7 THEN CASE WHEN sp.until IS NOT NULL THEN 'held' ELSE '` + issuing.FallbackRefused + `' END
        WHEN hp.source IS NULL THEN NULL
        WHEN d.ssl_ca_refused = $8 THEN 'held'
        WHEN hp.since >= now() - make_interval(secs => $9) AND NOT sc.second THEN 'held'
        WHEN sp.until IS NOT NULL THEN 'held'
        WHEN hp.since >= now() - make_interval(secs => $9) THEN '` + issuing.FallbackRenewal + `'
        WHEN hp.source = 'unreachable' THEN '` + issuing.FallbackOutage + `'
        WHEN hp.source = 'rate_limit' THEN '` + issuing.FallbackRateLimit + `'
        ELSE '` + issuing.FallbackLedger + `'
    END AS cause,
    COALESCE(LEAST(hp.paused_until, sp.until,
                   CASE WHEN hp.since + make_interval(secs => $9) > now() THEN hp.since + make_interval(secs => $9) END),
             now() + interval '1 minute') AS until
    FROM (SELECT 1) AS one
    LEFT JOIN LATERAL (
        SELECT p.source, p.paused_until,
               GREATEST(COALESCE(d.ssl_waiting_since, d.ssl_queued_at),
                        d.ssl_last_attempt_at + make_interval(secs => ` + backoffSQL("d.ssl_attempts", "$2", "$3") + `),
                        COALESCE(p.held_since, p.created_at)) AS since
        FROM certworker_pauses p
        WHERE ` + pauseOfFirstSQL + `
        ORDER BY 3 LIMIT 1) hp ON true
    LEFT JOIN LATERAL (` + heldAtSecondUntilSQL + `) sp ON true
    LEFT JOIN LATERAL (SELECT EXISTS (SELECT 1 FROM proxy_certificates c
                                      WHERE c.domain = d.domain AND c.issuer_directory = $8) AS second) sc ON true`

// claimRoutedSQL is the claim of a fleet with a second CA: like claimSQL, but it
// routes the rows it reads (routeSQL) before claiming up to $6 of them (head, then
// routed, so the planner cannot route the whole queue before sorting). A row no CA may
// be asked for now goes out of line as HeldRouted until its decision can change. Its
// columns are claimSQL's.
var claimRoutedSQL = `
WITH head AS MATERIALIZED (
    SELECT h.*, row_number() OVER () AS rn FROM (
        SELECT d.id, d.tenant_id, d.domain, d.ssl_ca_refused, d.ssl_waiting_since, d.ssl_queued_at,
            d.ssl_last_attempt_at, d.ssl_attempts,
            ` + readySQL("d") + ` AS ready, ` + keepsNameSQL("d") + ` AS keeps
        FROM proxy_domains d
        WHERE ` + inLineSQL + `
          AND COALESCE(d.ssl_queue_tier, 2) BETWEEN $10 AND $11
          AND d.ssl_attempts < $1
        ` + claimOrderSQL + `
        LIMIT $12
        FOR UPDATE OF d SKIP LOCKED) h
), routed AS MATERIALIZED (
    SELECT d.id, d.rn, d.ready, d.keeps, r.cause, r.until
    FROM head d
    LEFT JOIN LATERAL (` + routeSQL + `) r ON d.ready AND d.keeps
), due AS (
    SELECT id, rn, cause FROM routed
    WHERE ready AND keeps AND cause IS DISTINCT FROM 'held'
    ORDER BY rn
    LIMIT $6
), out AS (
    UPDATE proxy_domains d SET
        ssl_held = CASE WHEN r.ready THEN '` + HeldRouted + `' ELSE '` + HeldBackoff + `' END,
        ssl_held_until = CASE WHEN r.ready THEN r.until END
    FROM routed r WHERE d.id = r.id AND r.keeps AND (NOT r.ready OR r.cause = 'held')
    RETURNING d.id
` + claimTailSQL("due", true)

// fallbackArgs are the routed claim's parameters after claimSQL's seven.
func fallbackArgs(f *issuing.Fallback) []any {
	after := f.After
	if after <= 0 {
		after = issuing.DefaultFallbackAfter
	}
	return []any{f.Directory, seconds(after)}
}

var recordRefusedSQL = `
UPDATE proxy_domains SET ssl_ca_refused = $3, ssl_ca_refused_cause = $4
WHERE ` + heldSQL + `
RETURNING 1`

// RecordRefused records, under claim c, that the CA at directory refused c's name for
// good, and why: its orders then go to the other CA. The claim stays held.
func (q *Queue) RecordRefused(ctx context.Context, c issuing.Claim, directory, cause string) error {
	var one int
	err := q.db.QueryRow(ctx, recordRefusedSQL, c.ID, c.Token, directory, cause).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return q.whyNotHeld(ctx, c)
	}
	if err != nil {
		return fmt.Errorf("record the CA's refusal: %w", err)
	}
	return nil
}

var forgetRefusedSQL = `
UPDATE proxy_domains SET ssl_ca_refused = NULL, ssl_ca_refused_cause = NULL
WHERE ` + heldSQL + `
RETURNING 1`

// ForgetRefused forgets, under claim c, the refusal recorded for c.RefusedBy: the
// name's CAA records now allow that CA.
func (q *Queue) ForgetRefused(ctx context.Context, c issuing.Claim) error {
	var one int
	err := q.db.QueryRow(ctx, forgetRefusedSQL, c.ID, c.Token).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return q.whyNotHeld(ctx, c)
	}
	if err != nil {
		return fmt.Errorf("forget the CA's refusal: %w", err)
	}
	return nil
}

var redirectClaimSQL = `
UPDATE proxy_domains SET ssl_ca_directory = $3, ssl_ca_cause = NULLIF($4, '')
WHERE ` + heldSQL + `
RETURNING 1`

// RedirectClaim records, under claim c, that its order goes to directory for cause
// (Decide's decision, when CAA overrides the claim's).
func (q *Queue) RedirectClaim(ctx context.Context, c issuing.Claim, d issuing.Decision) error {
	var one int
	err := q.db.QueryRow(ctx, redirectClaimSQL, c.ID, c.Token, d.Directory, d.Cause).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return q.whyNotHeld(ctx, c)
	}
	if err != nil {
		return fmt.Errorf("record the claim's CA: %w", err)
	}
	return nil
}
