// Package failover holds the tests of certworker on highly available PostgreSQL: the
// real `certworker run` binary, as processes, against Pebble in the process
// (internal/pebbletest) and a real primary and streaming standby
// (internal/pgha), through a multi-host --database-url with
// target_session_attrs=read-write. Each test fails the primary over to the standby as
// an HA manager does and checks what docs/high-availability.md ("Failover") promises
// of it: every instance
// ready again within 5 s of the promotion, nothing lost, and no finalize for a claim
// the database no longer holds.
//
// The package has no code of its own; everything is in _test.go files. Its tests
// share one pair and run one after the other.
//
//	CERTWORKER_PG_IMAGE=certworker-postgres:15 go test -race ./internal/failover/
package failover
