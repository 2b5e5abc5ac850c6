package queue

// Case twins: two rows whose names differ only in case are one name to a CA. The
// proxy's unique constraint is on the name as written, so a tenant may add another
// tenant's name in another case. The rule of which row keeps the name is stated here,
// rendered as SQL by keepsNameSQL, and followed by certworker_certificate_for:
//
//   - Only verified acme rows count: anyone may add a row, only the owner can verify.
//   - Of two verified acme twins, the one holding the name's certificate keeps it: it
//     is already served.
//   - Else the one that became verified and acme first (ssl_eligible_at, stamped once
//     by a trigger); none comes last, and a tie goes to the smaller id.
//   - The other fails with ssl_error starting "duplicate domain:", never naming the
//     row that keeps the name, its spelling or its tenant.

// duplicateError starts the ssl_error of a domain whose name another row keeps in
// another case, as "invalid domain:" starts one no CA can issue for.
const duplicateError = "duplicate domain: "

// duplicateReason is the ssl_error of a row that lost its name to a twin.
const duplicateReason = duplicateError + "the name is held, in another case, by another domain that keeps it; " +
	"no certificate is ordered for this one"
