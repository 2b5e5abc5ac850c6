package queue

// Case twins: two rows whose names differ only in case are one name
// to a CA ("Shop.example" and "shop.example"). The proxy's unique constraint is on the
// name as written, so a tenant may add another tenant's name in another case. The rule
// that settles which row keeps the name is stated here, and rendered as SQL by
// keepsNameSQL (conditions.go) for the claim (which fails the other row itself), the
// housekeeping pass and the operator commands. What the proxy serves follows the same
// rule in certworker_certificate_for (migrations/functions), whose tests hold it to
// the cases below.
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
