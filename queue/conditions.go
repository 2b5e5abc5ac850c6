package queue

import (
	"fmt"

	"github.com/certworker/certworker/queue/issuing"
)

// The conditions and expressions the statements share, each defined once here.
// testdata/sql holds every statement as rendered.

// claimOrderSQL is the claim's order of service (see claimSQL).
const claimOrderSQL = `ORDER BY COALESCE(d.ssl_queue_tier, 2), COALESCE(d.ssl_queue_seq, 0), d.ssl_queued_at DESC NULLS LAST`

// column is column c of row x, or c alone when x is "".
func column(x, c string) string {
	if x == "" {
		return c
	}
	return x + "." + c
}

// managedSQL: row x is a domain certworker orders for, verified and acme.
func managedSQL(x string) string {
	return column(x, "verification_status") + ` = 'verified' AND ` + column(x, "ssl_provider") + ` = 'acme'`
}

// claimableAsSQL: row x is managed and pending (the wake trigger, the claim and the
// partial indexes agree on it).
func claimableAsSQL(x string) string {
	return managedSQL(x) + ` AND ` + column(x, "ssl_status") + ` = 'pending'`
}

// claimableSQL is claimableAsSQL of a statement's only row.
var claimableSQL = claimableAsSQL("")

// inLineAsSQL: row x is in line: claimable and not held out (ssl_held), the set of
// proxy_domains_line_idx and certworker_queue_place.
func inLineAsSQL(x string) string {
	return claimableAsSQL(x) + `
      AND ` + column(x, "ssl_held") + ` IS NULL`
}

// inLineSQL is inLineAsSQL of row d.
var inLineSQL = inLineAsSQL("d")

// readySQL: the retry backoff of row x has run out, with Config.Backoff's parameters.
func readySQL(x string) string { return readyAtSQL(x, "$2", "$3") }

// readyAtSQL is readySQL with --retry-base and --retry-max given as SQL expressions.
func readyAtSQL(x, base, cap string) string {
	return `(` + x + `.ssl_last_attempt_at IS NULL OR ` + x + `.ssl_last_attempt_at < now() - make_interval(secs => ` +
		backoffSQL(x+".ssl_attempts", base, cap) + `))`
}

// heldByPauseSQL is the pause holding row x back, as ssl_held names it, or NULL,
// looked up only while such a pause exists; which of several does not matter.
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

// heldKeysSQL is a recursive CTE named name of one column k: the distinct values of
// ssl_held of the claimable rows held out of line for anything but their backoff,
// each read once (a skip scan of proxy_domains_held_pause_idx), then a NULL.
func heldKeysSQL(name string) string {
	return name + ` AS (
    (SELECT ssl_held AS k FROM proxy_domains
     WHERE ` + claimableSQL + ` AND ssl_held <> '` + HeldBackoff + `' ORDER BY ssl_held LIMIT 1)
    UNION ALL
    SELECT (SELECT ssl_held FROM proxy_domains
            WHERE ` + claimableSQL + ` AND ssl_held <> '` + HeldBackoff + `' AND ssl_held > ` + name + `.k
            ORDER BY ssl_held LIMIT 1)
    FROM ` + name + ` WHERE ` + name + `.k IS NOT NULL
)`
}

// pauseOverSQL is true when no pause in force is the one held key k (an expression of
// heldKeysSQL's k) names: the rows held under it may come back.
func pauseOverSQL(k string) string {
	return `NOT EXISTS (
        SELECT 1 FROM certworker_pauses p
        WHERE p.scope || ':' || p.key = ` + k + ` AND p.paused_until > now())`
}

// maxPlaceSQL is the top of bigint, the last place in line there is.
const maxPlaceSQL = `9223372036854775807`

// placeSQL is the place in line of a row of tenant entering tier, by the wake
// trigger's rule (certworker_queue_place).
func placeSQL(tenant, tier string) string {
	return `certworker_queue_place(` + tenant + `, ` + tier + `)`
}

// pauseOfFirstSQL matches a pause p in force of the first CA ($7) holding row d back.
var pauseOfFirstSQL = `p.paused_until > now()
  AND ((p.scope = 'ca' AND p.key = $7)
    OR (p.scope IN ('registered_domain', 'domain') AND p.directory IN ($7, '')
        AND p.key = ANY (certworker_suffixes(d.domain))
        AND (p.scope = 'registered_domain' OR p.key = lower(d.domain)))
    OR ` + tenantReservePauseSQL("p", "d", "$7", "$8") + `)
  AND NOT ` + ledgerExemptSQL("p", "d", "$7", "$8")

// The values of ssl_held: why a claimable row is out of line until ReturnHeld (or
// the write named) brings it back. NULL is in line.
const (
	// HeldBackoff: its backoff has not run out.
	HeldBackoff = "backoff"
	// HeldRouted: the routed claim held it back until ssl_held_until.
	HeldRouted = "routed"
	// HeldDNS: it waits for its DNS (StartWait); EndWait, or a retry clearing its
	// 'waiting for DNS:' error, clears it.
	HeldDNS = "dns"
	// A pause that holds the row back is named SCOPE:KEY (heldByPauseSQL), e.g.
	// registered_domain:shop.example, ca:DIRECTORY, tenant:ID.
)

// heldAtSecondUntilSQL is the earliest end of the second CA's pauses holding row d.
var heldAtSecondUntilSQL = `SELECT min(p.paused_until) AS until FROM certworker_pauses p
        WHERE p.paused_until > now() AND p.directory = $8 AND NOT ` + ledgerExemptSQL("p", "d", "$8", "$8") + `
          AND ((p.scope = 'ca' AND p.key = $8)
            OR (p.scope IN ('registered_domain', 'domain')
                AND p.key = ANY (certworker_suffixes(d.domain))
                AND (p.scope = 'registered_domain' OR p.key = lower(d.domain)))
            OR ` + tenantReservePauseSQL("p", "d", "$8", "$8") + `)`

// backoffSQL is Config.Backoff in SQL, in seconds: base * 2^attempts, capped. Every
// statement comparing a backoff with the clock uses it, so none disagrees with Go.
func backoffSQL(attempts, base, cap string) string {
	return fmt.Sprintf("LEAST(%s * power(2, LEAST(GREATEST(%s, 0), %d)), %s)", base, attempts, issuing.MaxShift, cap)
}

// nextAttemptSQL is the attempt count after one more attempt, kept within int4 so a
// hand-edited count cannot fail the whole statement.
const nextAttemptSQL = "(LEAST(GREATEST(ssl_attempts, 0), 2147483646) + 1)"

// twinCountsSQL is true when row o is a case twin that counts: verified and acme.
func twinCountsSQL(o string) string { return managedSQL(o) }

// twinRankSQL is the rank of row x among its twins: holding a certificate, then the
// time it became verified and acme, then its id.
func twinRankSQL(x string) string {
	return `(CASE WHEN EXISTS (SELECT 1 FROM proxy_certificates c WHERE c.domain = ` + x + `.domain) THEN 0 ELSE 1 END,
         COALESCE(` + x + `.ssl_eligible_at, 'infinity'::timestamptz), ` + x + `.id)`
}

// keepsNameSQL is true when no verified acme case twin of row x ranks before it,
// whatever x's own state. A scalar count keeps one index probe per row, where NOT
// EXISTS may become an anti-join of the table.
func keepsNameSQL(x string) string {
	return `((SELECT count(*) FROM proxy_domains o
          WHERE lower(o.domain) = lower(` + x + `.domain) AND o.id <> ` + x + `.id AND ` + twinCountsSQL("o") + `
            AND ` + twinRankSQL("o") + ` < ` + twinRankSQL(x) + `) = 0)`
}

// failTwinsSQL is an UPDATE failing the rows of from with this id for which cond
// holds, as twins that lost their name, and recording the failure in their history;
// it returns returning (d is the row).
func failTwinsSQL(from, id, cond, returning string) string {
	return `UPDATE proxy_domains d SET
        ssl_status = 'failed', ssl_error = '` + duplicateReason + `', updated_at = now(), ` + releaseClaimSQL + `
    FROM ` + from + ` WHERE d.id = ` + id + ` AND ` + cond + `
    RETURNING ` + returning + `, ` + eventSQL("d", "'failed'", "'duplicate'", "d.ssl_error") + ` AS event_id`
}

// ariWindowSQL is true when domain's stored certificate is inside its last-read
// renewal window.
func ariWindowSQL(domain string) string {
	return `EXISTS (SELECT 1 FROM proxy_certificates x WHERE x.domain = ` + domain + `
               AND x.ari_window_start <= now() AND now() < x.ari_window_end)`
}

// renewalSQL is the one rule of "an order for domain is a renewal to the CA at
// directory": it holds a certificate this CA issued (certOfSQL) and the ledger saw
// this CA issue for the name. The claim and Admit both read it, so they never
// disagree (a claim Admit refuses would be claimed again and again).
func renewalSQL(domain, directory, second string) string {
	return `EXISTS (SELECT 1 FROM proxy_certificates x JOIN certworker_issued_names n
                       ON n.directory = ` + directory + ` AND n.name = lower(x.domain)
               WHERE x.domain = ` + domain + ` AND x.certificate_pem <> ''` + certOfSQL("x", directory, second) + `)`
}

// certOfSQL is the condition (a leading AND, or nothing without a second CA) that
// certificate row x is the CA at directory's: the second's are recorded as such, any
// other is the first's.
func certOfSQL(x, directory, second string) string {
	if second == "" {
		return ""
	}
	return `
                 AND (` + x + `.issuer_directory IS NOT DISTINCT FROM ` + second + `) = (` + directory + ` = ` + second + `)`
}

// ariExemptSQL is true for a renewal whose certificate is inside its window.
func ariExemptSQL(domain, directory, second string) string {
	return `(` + renewalSQL(domain, directory, second) + ` AND ` + ariWindowSQL(domain) + `)`
}

// ledgerExemptSQL is true when ledger pause p of the CA at directory lets row d
// pass: a renewal passes a 'ca' or registered-domain pause, an ARI renewal any.
func ledgerExemptSQL(p, d, directory, second string) string {
	return `(` + p + `.source = 'ledger' AND CASE WHEN ` + p + `.scope IN ('ca', 'registered_domain')
                                         THEN ` + renewalSQL(d+".domain", directory, second) + `
                                         ELSE ` + ariExemptSQL(d+".domain", directory, second) + ` END)`
}

// tenantReservePauseSQL is true when pause p is the tenant reserve's pause for row
// x's tenant and x is not a renewal the CA exempts.
func tenantReservePauseSQL(p, x, directory, second string) string {
	return `(` + p + `.scope = '` + issuing.ScopeTenant + `' AND ` + p + `.directory = ` + directory + `
         AND ` + p + `.key = ` + x + `.tenant_id::text AND NOT ` + renewalSQL(x+".domain", directory, second) + `)`
}

// dueByBackoffSQL: the rows that fall due when their backoff runs out (with
// claimableSQL, proxy_domains_due_line_idx's predicate); rows held otherwise fall due
// by their own clock.
const dueByBackoffSQL = `(ssl_held IS NULL OR ssl_held = '` + HeldBackoff + `')`

// routedUntilSQL is the earliest ssl_held_until of the routed rows.
var routedUntilSQL = `(SELECT min(ssl_held_until) FROM proxy_domains
     WHERE ` + claimableSQL + ` AND ssl_held = '` + HeldRouted + `')`

// releaseClaimSQL is the part of every finishing write that drops the claim.
const releaseClaimSQL = `ssl_claim_token = NULL, ssl_claimed_by = NULL, ssl_lease_expires_at = NULL`

// heldSQL is the fence of every finishing write: the row is still held by this claim
// ($1 id, $2 token) and still ACME, so a lost claim writes nothing and a tenant who
// switched provider mid-order keeps their upload.
const heldSQL = `id = $1 AND ssl_claim_token = $2 AND ssl_status = 'provisioning' AND ssl_provider = 'acme'`

// secondsUntilSQL is the time from now to ts, in seconds, on the database's clock,
// converting both to seconds first: PostgreSQL before 17 cannot subtract 'infinity'
// (+Inf here, capped by durationFromSeconds).
func secondsUntilSQL(ts string) string {
	return "(EXTRACT(epoch FROM (" + ts + ")) - EXTRACT(epoch FROM clock_timestamp()))::float8"
}

// finiteSQL is ts, or NULL when infinite: Go (and pgx) has no infinite time.
func finiteSQL(ts string) string {
	return `(CASE WHEN isfinite(` + ts + `) THEN ` + ts + ` END)`
}

// leaseEndSQL is when row x's lease runs out, for the reclaim; a lease later than a
// whole lease from now (a hand edit) counts as run out. That "now" is
// clock_timestamp(), read as the row is, not now(): now() is the transaction's start,
// taken before the statement is planned and its snapshot taken, and a renewal that
// commits in between has its lease end that much later than now() + a lease. With
// now() a reclaim took such a live order for one whose lease had run out, and a
// renewal took its own instance's renewal for a lease run out (on a busy server,
// where planning takes a while).
func leaseEndSQL(x, lease string) string {
	return `(CASE WHEN ` + x + `.ssl_lease_expires_at > clock_timestamp() + make_interval(secs => ` + lease + `)
             THEN '-infinity'::timestamptz ELSE ` + x + `.ssl_lease_expires_at END)`
}

// profileMovedOnSQL is true, in MarkActive, when the domain names a profile of its
// own other than the certificate's ($13, when recorded) and the refused one ($14),
// and the certificate renews automatically: certworker_set_profile's rule.
const profileMovedOnSQL = `(ssl_profile IS NOT NULL AND $13::text IS NOT NULL AND ssl_profile <> $13::text
          AND ssl_profile IS DISTINCT FROM $14::text
          AND COALESCE((SELECT x.auto_renew FROM proxy_certificates x WHERE x.domain = proxy_domains.domain), true))`

// heldSinceSQL is held_since on an upsert of pause p: kept while a pause is in
// force, now when a new hold begins.
const heldSinceSQL = `CASE WHEN p.paused_until > now() THEN COALESCE(p.held_since, p.created_at) ELSE now() END`

// nextAttemptAtSQL is when a pending row is next tried: its backoff or the end of
// its pause, whichever is later; NULL for a row no pass takes.
func nextAttemptAtSQL(attempts, base, cap string) string {
	return `CASE WHEN d.ssl_status = 'pending' AND d.ssl_attempts < ` + attempts + `
              AND ` + managedSQL("d") + `
         THEN GREATEST(COALESCE(d.ssl_last_attempt_at + make_interval(secs => ` + backoffSQL("d.ssl_attempts", base, cap) + `), now()),
                       pz.paused_until,
                       (SELECT s.next_check_at FROM certworker_dns_state s
                        WHERE s.domain_id = d.id AND d.ssl_error LIKE 'waiting for DNS:%'))
    END`
}

// claimTailSQL is the end both claims share: take's rows become claims under a new
// lease, returned in order of service with the counts Claim reads on by (and, routed,
// each row's CA and refusals).
//
// The claim's time (claim_at: its last attempt, its lease's start, its history's
// event) is clock_timestamp(), read once as the rows are written, not now(): now() is
// when the statement arrived, before it was planned and its snapshot taken, and a row
// that became due in between (a renewal marked, a row verified) was claimed "before"
// it was due, its history's claim ahead of its queued event and its wake latency
// negative (seen on a busy server, 16 ms early). Read after the snapshot, the time is
// never before the commit that made the row due.
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
), claim_at AS MATERIALIZED (
    SELECT clock_timestamp() AS t
), claimed AS (
    UPDATE proxy_domains d SET
        ssl_status = 'provisioning',
        ssl_claim_prev_attempt_at = d.ssl_last_attempt_at,
        ssl_last_attempt_at = (SELECT t FROM claim_at),
        updated_at = (SELECT t FROM claim_at),
        ssl_claim_token = gen_random_uuid(),
        ssl_claimed_by = $4,
        ssl_lease_expires_at = (SELECT t FROM claim_at) + make_interval(secs => $5)` + setCA + `
    FROM ` + take + `
    WHERE d.id = ` + take + `.id
    RETURNING d.id, d.tenant_id, d.domain, d.ssl_attempts, d.ssl_claim_token, d.ssl_last_attempt_at,
        d.ssl_claim_prev_attempt_at, d.ssl_queued_at, d.ssl_profile, d.ssl_profile_refused,
        COALESCE(d.ssl_queue_tier, 2) = 2 AS first` + returnCA + `,
        certworker_domain_claimed(d.id, d.tenant_id, d.ssl_eligible_at, d.ssl_queued_at, (SELECT t FROM claim_at)) AS event_id
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
