package queue

// FleetStatementsForTest are FleetStats's statements, for the benchmark that shows
// their plans at a million domains.
var FleetStatementsForTest = []struct{ Name, SQL string }{
	{"status counts", statusCountsSQL},
	{"totals", totalsSQL},
	{"expiring unrenewed", expiringUnrenewedSQL},
	{"pending over an hour", pendingOverHourSQL},
	{"pauses", pausesSQL},
	{"ledger", ledgerSQL},
}
