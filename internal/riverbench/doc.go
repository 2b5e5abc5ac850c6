// Package riverbench measures certworker's wake path beside River's
// (github.com/riverqueue/river), the PostgreSQL job queue a Go engineer would pick:
// a job inserted, timed to its worker's fetch, on the same server at the same
// spacing as a tenant's "verify" timed to certworker's claim. It is a module of its
// own so that River stays out of certworker's module and binary; `make bench` runs
// it (a nested module is not part of the root's ./...).
package riverbench
