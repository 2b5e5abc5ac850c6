// Package migrations holds the schema as SQL files, embedded in the binary and applied
// by goose (see cmd/certworker migrate).
//
// Files are numbered and never edited once released: a change is a new file. Every
// change is additive (CONTRACT.md §1), because the proxy reads and writes the same
// tables and is deployed on its own schedule.
package migrations

import "embed"

// FS holds every migration, in goose's "NNNNN_name.sql" form.
//
//go:embed *.sql
var FS embed.FS
