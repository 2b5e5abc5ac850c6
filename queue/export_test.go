package queue

import "context"

// ClaimSQLForTest is the claim statement, for EXPLAIN in tests.
var ClaimSQLForTest = claimSQL

// ClaimOrderForTest is the claim's ORDER BY, for benchmarks that compare it with the
// first-in-first-out order it replaced.
const ClaimOrderForTest = claimOrderSQL

// ClaimRoutedSQLForTest is the claim statement with a second CA, for EXPLAIN in tests.
var ClaimRoutedSQLForTest = claimRoutedSQL

// ErrorTextForTest is what q stores as ssl_error for s (SanitizeError for q's
// database's encoding).
func ErrorTextForTest(ctx context.Context, q *Queue, s string) string { return q.errorText(ctx, s) }

// TwinCandidatesSQLForTest is the housekeeping's search for case twins, for EXPLAIN in
// tests.
var TwinCandidatesSQLForTest = twinCandidatesSQL

// ReturnHeldSQLForTest is ReturnHeld's statement for the CA at directory.
func ReturnHeldSQLForTest(q *Queue, directory string) string { return q.returnHeldStatement(directory) }

// KeepsNameSQL is keepsNameSQL, for the test that it names one keeper.
var KeepsNameSQL = keepsNameSQL
