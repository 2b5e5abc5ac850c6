// Package e2e holds the end-to-end tests and the issuance benchmark: the real worker
// (queue/worker, built by worker.New as `certworker run` builds it) with the real ACME issuer (acme.Issuer)
// against Pebble running in the process (internal/pebbletest), on a fresh PostgreSQL
// database per test (internal/pgtest). Nothing is faked: a domain goes from
// "verified" to a certificate stored in proxy_certificates through HTTP-01 answered
// by an acme.Responder, as in production.
//
// The package has no code of its own; everything is in _test.go files.
//
//	CERTWORKER_PG_IMAGE=certworker-postgres:15 go test -race ./internal/e2e/
//	CERTWORKER_PG_IMAGE=certworker-postgres:15 go test -run '^$' -bench BenchmarkIssuance -benchtime 1x -timeout 40m ./internal/e2e/
//
// The benchmark writes its table to bench/issuance.txt at the root of the repository.
package e2e
