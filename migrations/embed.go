// Package migrations holds the schema as SQL files, embedded in the binary and applied
// by goose (see cmd/certworker migrate).
//
// Files are numbered, and a change is a new file. Every change is additive (CONTRACT.md
// §1), because the proxy reads and writes the same tables and is deployed on its own
// schedule. Every file is online-safe and idempotent, because Up runs a migration
// again from its first statement when one gave up waiting for a lock, and because a
// migrate that was interrupted is finished by the next: `-- +goose NO TRANSACTION`
// where a statement must run outside a transaction (CREATE INDEX CONCURRENTLY),
// IF NOT EXISTS and catalogue checks, constraints added NOT VALID and then validated,
// and DO blocks for statements that must take effect together. 00001 and 00002 were
// made so after their release (issue #10), before any production database had run
// them; what they leave behind is unchanged, but for proxy_certificates.expires_at,
// which is nullable as the reference had it (00006 drops NOT NULL where the old 00001
// set it).
package migrations

import "embed"

// FS holds every migration, in goose's "NNNNN_name.sql" form.
//
//go:embed *.sql
var FS embed.FS
