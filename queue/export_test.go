package queue

// ClaimSQLForTest is the claim statement, for EXPLAIN in tests.
var ClaimSQLForTest = claimSQL
