package queue

// Case twins (CONTRACT.md §5): two rows whose names differ only in case are one name
// to a CA ("Shop.example" and "shop.example"). The proxy's unique constraint is on the
// name as written, so a tenant may add another tenant's name in another case. The rule
// that settles which row keeps the name is stated here once, as SQL, and read by the
// claim (which fails the other row itself), the housekeeping pass, the certificate
// store's serving rule and the operator commands; docs/proxy-integration.md ("Serving
// case twins") gives it to the proxy.
//
//   - Only verified acme rows count. A row that is unverified or not acme never holds
//     back, fails or stops serving a verified one: anyone may add a row, only the
//     name's owner can verify it.
//   - Of two verified acme twins, the one holding the name's certificate keeps the
//     name: it is already served, and taking it away would break a working site.
//   - Failing that (both or neither hold one), the one that became verified and acme
//     first keeps it: ssl_eligible_at, recorded once by a BEFORE trigger when the row
//     enters that state (migration 00019), never stamped again by a failure or a
//     hand-back as ssl_queued_at is. A row that has none (a hand edit) comes last; a
//     tie goes to the smaller id, so the rule always names exactly one.
//   - The other row fails with ssl_error starting "duplicate domain:", in words that
//     never name or identify the row that keeps the name, its spelling or its tenant.

// duplicateError starts the ssl_error of a domain whose name another row keeps in
// another case, as "invalid domain:" starts one no CA can issue for.
const duplicateError = "duplicate domain: "

// duplicateReason is the whole ssl_error of a row that lost its name to a twin. It
// says what the tenant can do without saying who holds the name.
const duplicateReason = duplicateError + "the name is held, in another case, by another domain that keeps it; " +
	"no certificate is ordered for this one"

// twinCountsSQL is true when row o (an alias of proxy_domains) is a case twin that
// counts: verified and acme.
func twinCountsSQL(o string) string {
	return o + `.verification_status = 'verified' AND ` + o + `.ssl_provider = 'acme'`
}

// twinRankSQL is the rank of row x among its twins, smaller first: holding a
// certificate, then the time it became verified and acme, then its id.
func twinRankSQL(x string) string {
	return `(CASE WHEN EXISTS (SELECT 1 FROM proxy_certificates c WHERE c.domain = ` + x + `.domain) THEN 0 ELSE 1 END,
         COALESCE(` + x + `.ssl_eligible_at, 'infinity'::timestamptz), ` + x + `.id)`
}

// KeepsNameSQL is true when no verified acme case twin of row x (an alias of
// proxy_domains) comes before it (the rules above): x keeps its name. It says nothing
// of x's own state; a row that is not verified and acme is to be judged by the caller
// (it keeps nothing from a CA's point of view). It is one probe of the index on
// lower(domain) (migration 00006) per row: a scalar count, which the planner keeps a
// probe per row read, rather than NOT EXISTS, which it may turn into an anti-join of
// the whole table.
func KeepsNameSQL(x string) string {
	return `((SELECT count(*) FROM proxy_domains o
          WHERE lower(o.domain) = lower(` + x + `.domain) AND o.id <> ` + x + `.id AND ` + twinCountsSQL("o") + `
            AND ` + twinRankSQL("o") + ` < ` + twinRankSQL(x) + `) = 0)`
}

// failTwinsSQL is an UPDATE that fails the rows of from (a FROM item) whose id is id
// and for which cond holds, as twins that lost their name (duplicateReason), dropping
// any claim; it returns returning (d is the row).
func failTwinsSQL(from, id, cond, returning string) string {
	return `UPDATE proxy_domains d SET
        ssl_status = 'failed', ssl_error = '` + duplicateReason + `', updated_at = now(), ` + releaseClaimSQL + `
    FROM ` + from + ` WHERE d.id = ` + id + ` AND ` + cond + `
    RETURNING ` + returning
}
