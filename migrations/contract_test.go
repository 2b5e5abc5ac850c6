package migrations_test

import (
	"io/fs"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/migrations"
)

// firstWindowed is the first numbered migration the compatibility window
// (docs/upgrading.md) applies to; the ones before it are not checked.
const firstWindowed = 26

// Markers of the contract step: what a release removes of what the release before
// it no longer needs. Only between them may a numbered migration drop, rename or
// retype anything.
const (
	contractBegin = "-- +certworker ContractBegin"
	contractEnd   = "-- +certworker ContractEnd"
)

var (
	lineComment = regexp.MustCompile(`--[^\n]*`)
	// removal is a statement that takes away something the previous release's code
	// may use: a DROP of any object, column, constraint, default or NOT NULL, a
	// RENAME, a column's type changed, a table emptied.
	removal = regexp.MustCompile(`(?is)\b(DROP\s+(?:(?:TRIGGER|INDEX|FUNCTION|CONSTRAINT|TABLE|COLUMN|VIEW|TYPE|SEQUENCE|SCHEMA|POLICY|PUBLICATION)\s+(?:CONCURRENTLY\s+)?(?:IF\s+EXISTS\s+)?(?:public\.)?([a-z_][a-z0-9_]*))?|RENAME\b|ALTER\s+COLUMN\s+\S+\s+(?:SET\s+DATA\s+)?TYPE\b|TRUNCATE\b)`)
)

// removals lists the statements of a numbered migration's Up section that take
// something away outside the contract step. A DROP of a trigger, index, constraint or
// function that the same section creates again under the same name replaces it
// rather than removes it, and is not listed.
func removals(sql string) []string {
	up := sql
	if i := strings.Index(up, "-- +goose Up"); i >= 0 {
		up = up[i:]
	}
	if i := strings.Index(up, "-- +goose Down"); i >= 0 {
		up = up[:i]
	}
	for {
		b := strings.Index(up, contractBegin)
		if b < 0 {
			break
		}
		e := strings.Index(up[b:], contractEnd)
		if e < 0 {
			return []string{"a contract step that does not end (" + contractEnd + ")"}
		}
		up = up[:b] + up[b+e+len(contractEnd):]
	}
	up = lineComment.ReplaceAllString(up, "")
	var out []string
	for _, m := range removal.FindAllStringSubmatch(up, -1) {
		if name := m[2]; name != "" && recreated(up, name) {
			continue
		}
		out = append(out, strings.Join(strings.Fields(m[0]), " "))
	}
	return out
}

// recreated reports whether sql creates an object named name (a trigger, index,
// constraint or function), so that a DROP of it before is a replacement.
func recreated(sql, name string) bool {
	q := regexp.QuoteMeta(name)
	return regexp.MustCompile(`(?is)\b(?:CREATE\s+(?:OR\s+REPLACE\s+)?(?:CONSTRAINT\s+)?TRIGGER\s+` + q +
		`\b|CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:CONCURRENTLY\s+)?(?:IF\s+NOT\s+EXISTS\s+)?` + q +
		`\b|CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+(?:public\.)?` + q + `\s*\(|ADD\s+CONSTRAINT\s+` + q + `\b)`).MatchString(sql)
}

// Every numbered migration of a release with the window only adds, outside its
// contract step: the previous release's binary still runs on the schema it leaves.
func TestContract_NumberedMigrationsOnlyAdd(t *testing.T) {
	files, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	var checked int
	for _, f := range files {
		v, err := goose.NumericComponent(path.Base(f))
		require.NoError(t, err)
		if v < firstWindowed {
			continue
		}
		checked++
		b, err := fs.ReadFile(migrations.FS, f)
		require.NoError(t, err)
		require.Empty(t, removals(string(b)),
			"%s drops, renames or retypes something outside a contract step: the previous release's binary may use it. "+
				"Remove it one release later, between %q and %q (docs/upgrading.md)", f, contractBegin, contractEnd)
	}
	require.NotZero(t, checked)
}

// The check finds what would break the previous release's binary, and lets through
// what only adds, replaces, or is marked as the contract step.
func TestContract_TheCheckFindsDropsAndRenames(t *testing.T) {
	for _, tc := range []struct {
		sql  string
		want []string
	}{
		{"-- +goose Up\nALTER TABLE proxy_domains ADD COLUMN IF NOT EXISTS x text;\n-- +goose Down\nALTER TABLE proxy_domains DROP COLUMN x;", nil},
		{"-- +goose Up\nALTER TABLE proxy_domains DROP COLUMN ssl_held;", []string{"DROP COLUMN ssl_held"}},
		{"-- +goose Up\nALTER TABLE proxy_domains RENAME COLUMN ssl_held TO ssl_hold;", []string{"RENAME"}},
		{"-- +goose Up\nALTER TABLE certworker_pauses ALTER COLUMN key TYPE varchar(10);", []string{"ALTER COLUMN key TYPE"}},
		{"-- +goose Up\nDROP FUNCTION IF EXISTS public.certworker_queued();", []string{"DROP FUNCTION IF EXISTS public.certworker_queued"}},
		{"-- +goose Up\nALTER TABLE proxy_domains ALTER COLUMN ssl_held DROP NOT NULL;", []string{"DROP"}},
		{"-- +goose Up\nDROP INDEX CONCURRENTLY IF EXISTS proxy_domains_line_idx;", []string{"DROP INDEX CONCURRENTLY IF EXISTS proxy_domains_line_idx"}},
		{"-- +goose Up\nTRUNCATE certworker_ledger;", []string{"TRUNCATE"}},
		// A replacement under the same name.
		{"-- +goose Up\nDROP TRIGGER IF EXISTS certworker_x ON proxy_domains;\nCREATE TRIGGER certworker_x AFTER UPDATE ON proxy_domains FOR EACH ROW EXECUTE FUNCTION f();", nil},
		{"-- +goose Up\nALTER TABLE t DROP CONSTRAINT IF EXISTS t_c;\nALTER TABLE t ADD CONSTRAINT t_c CHECK (x > 0) NOT VALID;", nil},
		// The contract step, and comments.
		{"-- +goose Up\n-- We never DROP or RENAME here.\n" + contractBegin + "\nALTER TABLE proxy_domains DROP COLUMN IF EXISTS ssl_old;\n" + contractEnd + "\n", nil},
		{"-- +goose Up\n" + contractBegin + "\nDROP TABLE certworker_old;\n", []string{"a contract step that does not end (" + contractEnd + ")"}},
	} {
		require.Equal(t, tc.want, removals(tc.sql), "%s", tc.sql)
	}
}
