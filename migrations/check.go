package migrations

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/pressly/goose/v3"
)

// BehindError: the database lacks migrations this binary has. `certworker migrate`
// of this binary's release applies them.
type BehindError struct {
	// Version is the newest migration the database has (0 for none).
	Version int64
	// Want is this binary's newest.
	Want int64
	// Missing are the migrations the database lacks.
	Missing []int64
	// Release is this binary's release.
	Release string
}

func (e *BehindError) Error() string {
	return fmt.Sprintf("the database schema is behind this binary (it lacks migration %s; this binary's newest is %d): run `certworker migrate` of release %s first",
		joinVersions(e.Missing), e.Want, e.Release)
}

// AheadError: the database has migrations this binary does not know, and no record
// of the release that applied them that says it serves this binary's. This binary
// would work with rules it does not know, so it does not start.
type AheadError struct {
	// Version is the newest migration the database has.
	Version int64
	// Known is this binary's newest.
	Known int64
	// Unknown are the database's migrations this binary lacks.
	Unknown []int64
}

func (e *AheadError) Error() string {
	return fmt.Sprintf("the database schema is ahead of this binary (a newer certworker applied migration %s; this binary knows up to %d): run the newer certworker, not this one",
		joinVersions(e.Unknown), e.Known)
}

func joinVersions(vs []int64) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprintf("%05d", v)
	}
	return strings.Join(s, ", ")
}

// CheckRelease compares the database's schema with release rel: its migrations, the
// functions its migrate recorded (functions.go), and the release certworker_release
// records (release.go). Nil when rel may run on it: the schema is rel's, or that of a
// newer release that still serves rel. Otherwise a *BehindError or a *FunctionsError
// (older than rel: run rel's migrate), a *WindowError (a newer release that no longer
// serves rel), an *AheadError or an ahead *FunctionsError (newer, with no record of a
// release serving rel), and any other error when the schema cannot be read. It only
// reads: unlike goose's HasPending, it does not create goose's version table on a
// database that has never been migrated (that is a BehindError).
func CheckRelease(ctx context.Context, db *sql.DB, rel Release) error {
	embedded, err := embeddedVersions(rel.fsys())
	if err != nil {
		return err
	}
	applied, err := appliedVersions(ctx, db)
	if err != nil {
		return err
	}
	var missing, unknown []int64
	for _, v := range embedded {
		if !slices.Contains(applied, v) {
			missing = append(missing, v)
		}
	}
	for _, v := range applied {
		if !slices.Contains(embedded, v) {
			unknown = append(unknown, v)
		}
	}
	newest := func(vs []int64) int64 {
		if len(vs) == 0 {
			return 0
		}
		return slices.Max(vs)
	}
	if len(missing) > 0 {
		return &BehindError{Version: newest(applied), Want: newest(embedded), Missing: missing, Release: rel.Version}
	}
	rec, err := ReadRelease(ctx, db)
	if err != nil {
		return err
	}
	if rec != nil && newerThan(rec.ServesFrom, rel.Version) {
		return &WindowError{Database: rec.Release, ServesFrom: rec.ServesFrom, Binary: rel.Version}
	}
	newer := rec != nil && newerThan(rec.Release, rel.Version)
	if len(unknown) > 0 && !newer {
		return &AheadError{Version: newest(applied), Known: newest(embedded), Unknown: unknown}
	}
	return checkFunctions(ctx, db, rel.fsys(), newer)
}

// embeddedVersions are the versions of the numbered migrations of fsys, ascending.
func embeddedVersions(fsys fs.FS) ([]int64, error) {
	files, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("list migrations: %w", err)
	}
	out := make([]int64, 0, len(files))
	for _, f := range files {
		v, err := goose.NumericComponent(path.Base(f))
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", f, err)
		}
		out = append(out, v)
	}
	slices.Sort(out)
	return out, nil
}

// appliedVersions are the versions goose's table records as applied (the last entry
// for a version decides: goose's older API recorded a rollback as a row with
// is_applied false), ascending, without goose's version 0.
func appliedVersions(ctx context.Context, db *sql.DB) ([]int64, error) {
	var exists bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass('goose_db_version') IS NOT NULL`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("read schema version: %w", err)
	}
	if !exists {
		return nil, nil
	}
	rows, err := db.QueryContext(ctx, `
SELECT version_id FROM (
    SELECT DISTINCT ON (version_id) version_id, is_applied
    FROM goose_db_version ORDER BY version_id, id DESC) v
WHERE is_applied AND version_id > 0 ORDER BY version_id`)
	if err != nil {
		return nil, fmt.Errorf("read schema version: %w", err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("read schema version: %w", err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read schema version: %w", err)
	}
	return out, nil
}
