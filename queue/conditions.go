package queue

import (
	"fmt"

	"github.com/certworker/certworker/queue/issuing"
)

// The conditions and expressions the statements share, each defined once here and
// rendered into the statements that use it when the package is initialised.
// testdata/sql holds every statement as rendered.

// claimOrderSQL is the claim's order of service (see claimSQL).
const claimOrderSQL = `ORDER BY COALESCE(d.ssl_queue_tier, 2), COALESCE(d.ssl_queue_seq, 0), d.ssl_queued_at DESC NULLS LAST`

// column is column c of row x, or c alone for the row of a statement without alias
// (x "").
func column(x, c string) string {
	if x == "" {
		return c
	}
	return x + "." + c
}

// managedSQL: row x is a domain certworker orders for, verified and acme. Only such
// rows count among case twins (twinCountsSQL) and in the fleet's figures.
func managedSQL(x string) string {
	return column(x, "verification_status") + ` = 'verified' AND ` + column(x, "ssl_provider") + ` = 'acme'`
}

// claimableAsSQL: row x is in the claimable set, managed and pending: what the wake
// trigger, the claim and the partial indexes of the queue agree on.
func claimableAsSQL(x string) string {
	return managedSQL(x) + ` AND ` + column(x, "ssl_status") + ` = 'pending'`
}

// claimableSQL is claimableAsSQL of a statement's only row.
var claimableSQL = claimableAsSQL("")

// inLineAsSQL: row x is in line, the set the claim reads (proxy_domains_line_idx):
// claimable, and not taken out of line by a failure, a pause or a backoff (ssl_held).
// The wake trigger's place in line (certworker_queue_place) reads the same set.
func inLineAsSQL(x string) string {
	return claimableAsSQL(x) + `
      AND ` + column(x, "ssl_held") + ` IS NULL`
}

// inLineSQL is inLineAsSQL of row d.
var inLineSQL = inLineAsSQL("d")

// readySQL: the retry backoff (docs/internals.md) has run out for row x, computed from its
// own ssl_attempts with the same parameters as Config.Backoff ($2, $3).
func readySQL(x string) string { return readyAtSQL(x, "$2", "$3") }

// readyAtSQL is readySQL with --retry-base and --retry-max given as SQL expressions.
func readyAtSQL(x, base, cap string) string {
	return `(` + x + `.ssl_last_attempt_at IS NULL OR ` + x + `.ssl_last_attempt_at < now() - make_interval(secs => ` +
		backoffSQL(x+".ssl_attempts", base, cap) + `))`
}

// heldByPauseSQL is a pause of a registered domain or of one name that holds row x
// back, as ssl_held names it ('registered_domain:KEY', 'domain:KEY'), or NULL. It is
// looked up among the row's own suffixes (certworker_suffixes), and only while such a
// pause exists at all. Which one, when several hold the row, does not matter:
// ReturnHeld looks again once it has ended.
func heldByPauseSQL(x, dir string) string {
	return `CASE WHEN EXISTS (SELECT 1 FROM certworker_pauses
                   WHERE (scope <> 'ca' OR (key = ` + dir + ` AND source = 'ledger')) AND paused_until > now()) THEN
         (SELECT p.scope || ':' || p.key FROM certworker_pauses p
          WHERE ((p.scope IN ('registered_domain', 'domain') AND p.directory IN (` + dir + `, '')
                  AND p.key = ANY (certworker_suffixes(` + x + `.domain))
                  AND (p.scope = 'registered_domain' OR p.key = lower(` + x + `.domain)))
                 OR (p.scope = 'ca' AND p.key = ` + dir + ` AND p.source = 'ledger')
                 OR ` + tenantReservePauseSQL("p", x, dir, "") + `)
            AND p.paused_until > now()
            AND NOT ` + ledgerExemptSQL("p", x, dir, "") + `
          LIMIT 1) END`
}

// maxPlaceSQL is the top of bigint, the last place in line there is.
const maxPlaceSQL = `9223372036854775807`

// placeSQL is the place in line of a row of tenant entering tier: the wake
// trigger's rule, certworker_queue_place, which is the one definition of it (one past
// the tenant's last place in line in the tier, never before the tier's front, clamped
// below maxPlaceSQL).
func placeSQL(tenant, tier string) string {
	return `certworker_queue_place(` + tenant + `, ` + tier + `)`
}

// pauseOfFirstSQL matches a pause p in force of the first CA ($7) that holds row d
// back: the CA's own, or its pause of d's registered domain or name.
var pauseOfFirstSQL = `p.paused_until > now()
  AND ((p.scope = 'ca' AND p.key = $7)
    OR (p.scope IN ('registered_domain', 'domain') AND p.directory IN ($7, '')
        AND p.key = ANY (certworker_suffixes(d.domain))
        AND (p.scope = 'registered_domain' OR p.key = lower(d.domain)))
    OR ` + tenantReservePauseSQL("p", "d", "$7", "$8") + `)
  AND NOT ` + ledgerExemptSQL("p", "d", "$7", "$8")

// The values of ssl_held: why a claimable row is out of line, so that no claim reads
// it until ReturnHeld (or the write named) brings it back. NULL is in line
// (inLineSQL). Every statement that writes or compares a value uses these.
const (
	// HeldBackoff: its backoff has not run out. Set by the failure write (Fail) and
	// by a claim that read the row before its backoff ran out; cleared by ReturnHeld
	// once the backoff has run out.
	HeldBackoff = "backoff"
	// HeldRouted: the routed claim held it back at the CA it would go to for now,
	// until ssl_held_until; cleared by ReturnHeld then, for the next claim to route
	// it again.
	HeldRouted = "routed"
	// HeldDNS: it waits for its DNS (StartWait), checked by DNS alone, never by the
	// CA. ReturnHeld leaves it out of line; EndWait clears it, and so does anyone
	// who clears its 'waiting for DNS:' error (a retry, by the proxy or `certworker
	// retry`), which brings its check forward.
	HeldDNS = "dns"
	// A pause that holds the row back is named SCOPE:KEY, as heldByPauseSQL
	// renders it (registered_domain:shop.example, domain:a.shop.example,
	// ca:DIRECTORY for the ledger's pause of the account, tenant:ID for the tenant
	// reserve). Set by the claim that read the row; cleared by ReturnHeld once no
	// pause holds the row.
)

// heldAtSecondUntilSQL is until, the earliest end of the pauses in force of the second
// CA ($8) that hold row d back, NULL when none does.
var heldAtSecondUntilSQL = `SELECT min(p.paused_until) AS until FROM certworker_pauses p
        WHERE p.paused_until > now() AND p.directory = $8 AND NOT ` + ledgerExemptSQL("p", "d", "$8", "$8") + `
          AND ((p.scope = 'ca' AND p.key = $8)
            OR (p.scope IN ('registered_domain', 'domain')
                AND p.key = ANY (certworker_suffixes(d.domain))
                AND (p.scope = 'registered_domain' OR p.key = lower(d.domain)))
            OR ` + tenantReservePauseSQL("p", "d", "$8", "$8") + `)`

// backoffSQL is Config.Backoff in SQL, in seconds, for the attempt count in the column
// attempts: base * 2^attempts, capped, negative counts as 0. base and cap are the
// parameter placeholders the caller binds. Every statement that compares a row's
// backoff with the clock (the claim, the next due time, status) uses it, so they
// cannot disagree with each other or, through the same parameters, with Go.
func backoffSQL(attempts, base, cap string) string {
	return fmt.Sprintf("LEAST(%s * power(2, LEAST(GREATEST(%s, 0), %d)), %s)", base, attempts, issuing.MaxShift, cap)
}

// nextAttemptSQL is the attempt count after one more attempt: negative counts as 0,
// and a hand-edited count at the top of int4 stays in range instead of making the
// whole statement fail (and with it every other row it would have moved).
const nextAttemptSQL = "(LEAST(GREATEST(ssl_attempts, 0), 2147483646) + 1)"

// twinCountsSQL is true when row o (an alias of proxy_domains) is a case twin that
// counts: verified and acme.
func twinCountsSQL(o string) string { return managedSQL(o) }

// twinRankSQL is the rank of row x among its twins, smaller first: holding a
// certificate, then the time it became verified and acme, then its id.
func twinRankSQL(x string) string {
	return `(CASE WHEN EXISTS (SELECT 1 FROM proxy_certificates c WHERE c.domain = ` + x + `.domain) THEN 0 ELSE 1 END,
         COALESCE(` + x + `.ssl_eligible_at, 'infinity'::timestamptz), ` + x + `.id)`
}

// keepsNameSQL is true when no verified acme case twin of row x (an alias of
// proxy_domains) comes before it (the rules above): x keeps its name. It says nothing
// of x's own state; a row that is not verified and acme is to be judged by the caller
// (it keeps nothing from a CA's point of view). It is one probe of the index on
// lower(domain) (migration 00006) per row: a scalar count, which the planner keeps a
// probe per row read, rather than NOT EXISTS, which it may turn into an anti-join of
// the whole table.
func keepsNameSQL(x string) string {
	return `((SELECT count(*) FROM proxy_domains o
          WHERE lower(o.domain) = lower(` + x + `.domain) AND o.id <> ` + x + `.id AND ` + twinCountsSQL("o") + `
            AND ` + twinRankSQL("o") + ` < ` + twinRankSQL(x) + `) = 0)`
}

// failTwinsSQL is an UPDATE that fails the rows of from (a FROM item) whose id is id
// and for which cond holds, as twins that lost their name (duplicateReason), dropping
// any claim, and records the failure in their history; it returns returning (d is
// the row).
func failTwinsSQL(from, id, cond, returning string) string {
	return `UPDATE proxy_domains d SET
        ssl_status = 'failed', ssl_error = '` + duplicateReason + `', updated_at = now(), ` + releaseClaimSQL + `
    FROM ` + from + ` WHERE d.id = ` + id + ` AND ` + cond + `
    RETURNING ` + returning + `, ` + eventSQL("d", "'failed'", "'duplicate'", "d.ssl_error") + ` AS event_id`
}

// ariWindowSQL is true when the certificate stored for domain (an SQL expression of
// proxy_domains.domain) is inside the renewal window last read for it, on the
// database's clock.
func ariWindowSQL(domain string) string {
	return `EXISTS (SELECT 1 FROM proxy_certificates x WHERE x.domain = ` + domain + `
               AND x.ari_window_start <= now() AND now() < x.ari_window_end)`
}

// renewalSQL is the one rule of "is an order for domain a renewal to the CA at
// directory" (SQL expressions; second is the second CA's directory, "" without one):
// domain holds a stored certificate that this CA issued (certOfSQL), and the ledger
// saw this CA issue for the name before (certworker_issued_names). ariExemptSQL adds
// that the certificate is inside its window. The claim lets such rows past the
// ledger's pauses they are exempt from (ledgerExemptSQL), and Admit reads the same
// expression for the claims it is asked about (knownRenewals): the two cannot
// disagree. When they could, a renewal whose certificate came from the second CA,
// routed to the first during the first's account-wide pause, was passed by the claim
// (the first had issued for the name once) and refused by Admit (not the first's
// certificate), and the fill claimed it again at once, 170 times a second.
func renewalSQL(domain, directory, second string) string {
	return `EXISTS (SELECT 1 FROM proxy_certificates x JOIN certworker_issued_names n
                       ON n.directory = ` + directory + ` AND n.name = lower(x.domain)
               WHERE x.domain = ` + domain + ` AND x.certificate_pem <> ''` + certOfSQL("x", directory, second) + `)`
}

// certOfSQL is the condition (with a leading AND, or nothing without a second CA)
// that certificate row x was issued by the CA at directory: the second CA's
// certificates are recorded as such (issuer_directory); any other, one with no
// recorded CA included, is the first's. The worker's replacesPEM applies the same
// rule to decide whether the order names the certificate.
func certOfSQL(x, directory, second string) string {
	if second == "" {
		return ""
	}
	return `
                 AND (` + x + `.issuer_directory IS NOT DISTINCT FROM ` + second + `) = (` + directory + ` = ` + second + `)`
}

// ariExemptSQL is true for an ARI renewal: a renewal (renewalSQL) whose certificate
// is inside the window last read for it (ariWindowSQL).
func ariExemptSQL(domain, directory, second string) string {
	return `(` + renewalSQL(domain, directory, second) + ` AND ` + ariWindowSQL(domain) + `)`
}

// ledgerExemptSQL is true when pause p is a ledger's pause of the CA at directory that
// does not hold row d back (the rules above): a renewal the CA knows as one passes a pause of
// the account's orders (scope 'ca') or of its registered domain, and an ARI renewal
// passes every ledger pause. second is renewalSQL's.
func ledgerExemptSQL(p, d, directory, second string) string {
	return `(` + p + `.source = 'ledger' AND CASE WHEN ` + p + `.scope IN ('ca', 'registered_domain')
                                         THEN ` + renewalSQL(d+".domain", directory, second) + `
                                         ELSE ` + ariExemptSQL(d+".domain", directory, second) + ` END)`
}

// tenantReservePauseSQL is true when pause p is the tenant reserve's pause at the CA
// at directory of row x's tenant, and x is not a renewal the CA exempts from orders
// per account (renewalSQL, with second the second CA's directory or ""): such a pause
// holds x back.
func tenantReservePauseSQL(p, x, directory, second string) string {
	return `(` + p + `.scope = '` + issuing.ScopeTenant + `' AND ` + p + `.directory = ` + directory + `
         AND ` + p + `.key = ` + x + `.tenant_id::text AND NOT ` + renewalSQL(x+".domain", directory, second) + `)`
}

// dueByBackoffSQL: the rows that fall due when their backoff runs out, those in line
// and those held for their backoff. With claimableSQL it is the predicate of
// proxy_domains_due_line_idx (migration 00023). A row held under a pause falls due
// when the pause ends, a routed row at its ssl_held_until, and a row waiting for its
// DNS when a DNS check says so (the waiter): read here by backoff, 100,000 waiting
// rows would be read through on every pass, and a held row whose backoff had run out
// would make the next due time "now" for as long as it was held.
const dueByBackoffSQL = `(ssl_held IS NULL OR ssl_held = '` + HeldBackoff + `')`

// routedUntilSQL is the earliest ssl_held_until of the rows the routed claim held out
// (HeldRouted): when ReturnHeld next brings one back (proxy_domains_routed_idx).
var routedUntilSQL = `(SELECT min(ssl_held_until) FROM proxy_domains
     WHERE ` + claimableSQL + ` AND ssl_held = '` + HeldRouted + `')`

// releaseClaimSQL is the part of every finishing write that drops the claim.
const releaseClaimSQL = `ssl_claim_token = NULL, ssl_claimed_by = NULL, ssl_lease_expires_at = NULL`

// heldSQL is the condition of every finishing write: the row is still held by this
// claim ($1 id, $2 token) and is still an ACME domain. Fencing: an instance that lost
// its claim (another took the row after its lease ran out) writes nothing; and a
// tenant who switched the domain to another provider mid-order keeps what they
// uploaded.
const heldSQL = `id = $1 AND ssl_claim_token = $2 AND ssl_status = 'provisioning' AND ssl_provider = 'acme'`

// secondsUntilSQL is the time from now to the timestamp expression ts, in seconds, on
// the database's clock: every delay the worker waits for is computed where the time
// it compares with lives.
//
// The two times are turned into seconds before they are subtracted: a certworker
// column may hold 'infinity' (a hand edit), and subtracting infinite timestamps is an
// error on PostgreSQL before 17, which would stop every pass that reads the row.
// Infinity comes back as +Inf seconds, which durationFromSeconds caps.
func secondsUntilSQL(ts string) string {
	return "(EXTRACT(epoch FROM (" + ts + ")) - EXTRACT(epoch FROM clock_timestamp()))::float8"
}

// finiteSQL is the timestamp expression ts, or NULL when it is infinite: what a row
// hands to Go, which has no infinite time.Time (pgx refuses to scan one), so that a
// hand-edited 'infinity' reads as unknown instead of failing the statement.
func finiteSQL(ts string) string {
	return `(CASE WHEN isfinite(` + ts + `) THEN ` + ts + ` END)`
}

// leaseEndSQL is when the lease of row x (an alias of proxy_domains) runs out, for the
// reclaim: its ssl_lease_expires_at, but '-infinity', run out already, when that is
// later than now plus a whole lease (lease, an SQL expression of seconds). certworker
// never writes a lease longer than one from now, so such a value is a hand edit or a
// bug; 'infinity' would otherwise never be reclaimed.
func leaseEndSQL(x, lease string) string {
	return `(CASE WHEN ` + x + `.ssl_lease_expires_at > now() + make_interval(secs => ` + lease + `)
             THEN '-infinity'::timestamptz ELSE ` + x + `.ssl_lease_expires_at END)`
}

// profileMovedOnSQL is true, in MarkActive's UPDATE of proxy_domains, when the domain
// names a profile of its own ($14 the one the CA refused, $13 the certificate's) that
// is not the certificate's: the same rule as certworker_set_profile's and the profile
// trigger's. A certificate with no recorded profile, one the proxy does not renew, and
// a profile the CA refused (renewed under the certificate's) are kept.
const profileMovedOnSQL = `(ssl_profile IS NOT NULL AND $13::text IS NOT NULL AND ssl_profile <> $13::text
          AND ssl_profile IS DISTINCT FROM $14::text
          AND COALESCE((SELECT x.auto_renew FROM proxy_certificates x WHERE x.domain = proxy_domains.domain), true))`

// heldSinceSQL is certworker_pauses.held_since on an upsert of p: kept while a pause
// of it is in force, now when the last one had ended (a new hold begins).
const heldSinceSQL = `CASE WHEN p.paused_until > now() THEN COALESCE(p.held_since, p.created_at) ELSE now() END`

// nextAttemptAtSQL is when a pending row is next tried, by the curve $1-$3: its backoff,
// or the end of the pause that holds it, whichever is later; NULL for a row no pass
// takes (failed, at the limit, not verified, not acme).
func nextAttemptAtSQL(attempts, base, cap string) string {
	return `CASE WHEN d.ssl_status = 'pending' AND d.ssl_attempts < ` + attempts + `
              AND ` + managedSQL("d") + `
         THEN GREATEST(COALESCE(d.ssl_last_attempt_at + make_interval(secs => ` + backoffSQL("d.ssl_attempts", base, cap) + `), now()),
                       pz.paused_until,
                       (SELECT s.next_check_at FROM certworker_dns_state s
                        WHERE s.domain_id = d.id AND d.ssl_error LIKE 'waiting for DNS:%'))
    END`
}

// claimTailSQL is the end both claims share, from the twins they fail (lost): the
// rows of the CTE take (id, rn) become claims under a new lease, returned in order of
// service with how many rows the statement read and took out of line, by which Claim
// decides whether to read on. The routed claim (routed) also records and returns the
// CA each row goes to, from take's cause (NULL for the first CA, $7; else the second,
// $8), and the CAs' recorded refusals; the plain claim returns the one CA, $7.
func claimTailSQL(take string, routed bool) string {
	setCA, returnCA, selectCA := "", "", `CASE WHEN c.id IS NOT NULL THEN $7::text END, ''::text, ''::text, ''::text`
	if routed {
		setCA = `,
        ssl_ca_directory = CASE WHEN ` + take + `.cause IS NULL THEN $7 ELSE $8 END,
        ssl_ca_cause = ` + take + `.cause`
		returnCA = `,
        d.ssl_ca_directory, d.ssl_ca_cause, d.ssl_ca_refused, d.ssl_ca_refused_cause`
		selectCA = `c.ssl_ca_directory, c.ssl_ca_cause, c.ssl_ca_refused, c.ssl_ca_refused_cause`
	}
	return `), lost AS (
    ` + failTwinsSQL("head h", "h.id", "NOT h.keeps", "d.id") + `
), claimed AS (
    UPDATE proxy_domains d SET
        ssl_status = 'provisioning',
        ssl_claim_prev_attempt_at = d.ssl_last_attempt_at,
        ssl_last_attempt_at = now(),
        updated_at = now(),
        ssl_claim_token = gen_random_uuid(),
        ssl_claimed_by = $4,
        ssl_lease_expires_at = now() + make_interval(secs => $5)` + setCA + `
    FROM ` + take + `
    WHERE d.id = ` + take + `.id
    RETURNING d.id, d.tenant_id, d.domain, d.ssl_attempts, d.ssl_claim_token, d.ssl_last_attempt_at,
        d.ssl_claim_prev_attempt_at, d.ssl_queued_at, d.ssl_profile, d.ssl_profile_refused,
        COALESCE(d.ssl_queue_tier, 2) = 2 AS first` + returnCA + `,
        certworker_domain_claimed(d.id, d.tenant_id, d.ssl_eligible_at, d.ssl_queued_at, now()) AS event_id
)
SELECT c.id::text, c.tenant_id::text, c.domain, c.ssl_attempts, c.ssl_claim_token::text, c.ssl_last_attempt_at,
    ` + finiteSQL(`GREATEST(c.ssl_queued_at,
             c.ssl_claim_prev_attempt_at + make_interval(secs => `+backoffSQL("c.ssl_attempts", "$2", "$3")+`))`) + `,
    COALESCE((SELECT p.certificate_pem FROM proxy_certificates p WHERE p.domain = c.domain), ''),
    c.ssl_profile, c.ssl_profile_refused,
    (SELECT p.profile FROM proxy_certificates p WHERE p.domain = c.domain),
    c.first, ` + selectCA + `,
    (SELECT p.issuer_directory FROM proxy_certificates p WHERE p.domain = c.domain),
    n.taken_out, n.read
FROM (SELECT (SELECT count(*) FROM out) + (SELECT count(*) FROM lost) AS taken_out, (SELECT count(*) FROM head) AS read) n
LEFT JOIN (claimed c JOIN ` + take + ` t ON t.id = c.id) ON true
ORDER BY t.rn`
}
