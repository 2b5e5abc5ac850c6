package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"

	"golang.org/x/mod/semver"

	"github.com/certworker/certworker"
)

// The compatibility window: a binary runs against the schema of its own release and
// of the next one. The next release's migrate only adds (columns, tables, functions,
// triggers; a function body this release relies on keeps its behaviour), and what it
// no longer needs is removed one release later, in a step of its migrations marked
// as the contract step (TestContract_NumberedMigrationsOnlyAdd). So after the next
// release's migrate, this binary still runs, restarts, and can be rolled back to.
//
// certworker_release records, in one row, the release the schema was last migrated
// to and the oldest release whose binaries it still serves. Check accepts a schema
// of a newer release while that oldest is not newer than the binary's own; Up of an
// older binary on it changes nothing.

// servesFrom is the oldest release whose binaries run on this release's schema; ""
// is this release alone. A release that only adds sets it to the release before it.
// This one sets nothing: the binaries before it refuse any schema newer than their
// own, whatever it serves.
const servesFrom = ""

// Release is a release of certworker as migrate and Check see it: its version, the
// oldest release its schema serves, and its migrations.
type Release struct {
	// Version is the release's version (certworker.Version for this binary).
	Version string
	// ServesFrom is the oldest release whose binaries run on its schema; "" is
	// Version alone.
	ServesFrom string
	// FS holds its numbered migrations and, under functions/, its function files and
	// functions.sum, as FS does; nil is FS.
	FS fs.FS
}

// Current is this binary's release.
func Current() Release {
	return Release{Version: certworker.Version(), ServesFrom: servesFrom, FS: FS}
}

func (r Release) fsys() fs.FS {
	if r.FS == nil {
		return FS
	}
	return r.FS
}

func (r Release) oldest() string {
	if r.ServesFrom == "" {
		return r.Version
	}
	return r.ServesFrom
}

// newerThan reports whether version a is a later release than b (semantic
// versions, without the "v").
func newerThan(a, b string) bool { return semver.Compare("v"+a, "v"+b) > 0 }

// ReleaseRecord is what certworker_release holds.
type ReleaseRecord struct {
	// Release is the release the schema was last migrated to.
	Release string
	// ServesFrom is the oldest release whose binaries run on it.
	ServesFrom string
}

// ReadRelease reads certworker_release: nil (and no error) for a database that no
// release with the table has migrated.
func ReadRelease(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (*ReleaseRecord, error) {
	var rec ReleaseRecord
	err := q.QueryRowContext(ctx, `SELECT release, serves_from FROM certworker_release`).Scan(&rec.Release, &rec.ServesFrom)
	if isUndefinedTable(err) || errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the schema's release: %w", err)
	}
	return &rec, nil
}

// recordRelease writes rel into certworker_release once its migrations and functions
// are applied; Up never calls it for a release older than the one recorded.
func recordRelease(ctx context.Context, guard *sql.Conn, rel Release) error {
	_, err := guard.ExecContext(ctx, `
INSERT INTO certworker_release (id, release, serves_from) VALUES (true, $1, $2)
ON CONFLICT (id) DO UPDATE SET release = EXCLUDED.release, serves_from = EXCLUDED.serves_from, migrated_at = now()
WHERE (certworker_release.release, certworker_release.serves_from) IS DISTINCT FROM (EXCLUDED.release, EXCLUDED.serves_from)`,
		rel.Version, rel.oldest())
	if err != nil {
		return fmt.Errorf("record the schema's release: %w", err)
	}
	return nil
}

// NewerError: Up of a binary whose release is older than the one the database was
// migrated to. Nothing was changed: the newer release's schema serves this binary
// while Served says so, and this binary's migrations and functions would put back
// nothing the newer one needs. `certworker migrate` reports it and exits 0.
type NewerError struct {
	// Database is the release the database was migrated to, ServesFrom the oldest
	// release it serves.
	Database, ServesFrom string
	// Binary is this binary's release.
	Binary string
}

// Served reports whether the binary's release may run on the database.
func (e *NewerError) Served() bool { return !newerThan(e.ServesFrom, e.Binary) }

func (e *NewerError) Error() string {
	if e.Served() {
		return fmt.Sprintf("the database schema is of release %s, newer than this binary's %s, which it still serves: nothing changed",
			e.Database, e.Binary)
	}
	return fmt.Sprintf("the database schema is of release %s, which serves releases %s and newer, not this binary's %s: nothing changed; run `certworker migrate` of release %s or newer",
		e.Database, e.ServesFrom, e.Binary, e.ServesFrom)
}

// WindowError: the database was migrated to a release whose schema no longer serves
// this binary's (two releases or more ahead of it). `run` refuses it with exit 2.
type WindowError struct {
	// Database is the release the database was migrated to, ServesFrom the oldest
	// release it serves.
	Database, ServesFrom string
	// Binary is this binary's release.
	Binary string
}

func (e *WindowError) Error() string {
	if e.ServesFrom == e.Database {
		return fmt.Sprintf("the database schema is of release %s, which serves no older release (this binary is release %s): run certworker %s",
			e.Database, e.Binary, e.Database)
	}
	return fmt.Sprintf("the database schema is of release %s, which serves releases %s and newer (this binary is release %s): run certworker %s, or %s",
		e.Database, e.ServesFrom, e.Binary, e.Database, e.ServesFrom)
}

// Check compares the database's schema with this binary's release (CheckRelease of
// Current).
func Check(ctx context.Context, db *sql.DB) error {
	return CheckRelease(ctx, db, Current())
}
