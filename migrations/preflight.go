package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// valueSet is a CHECK constraint on one of proxy_domains' state columns (docs/
// reference.md, "The proxy's tables"). Migration 00001 declares them on a new table; 00006 adds them to a table that
// existed before (the proxy's, created without them), under the same names: the ones
// PostgreSQL gives a column's CHECK, "<table>_<column>_check". The two lists must
// agree, which TestPreflight_KnowsEveryValueSetTheSchemaEnforces checks.
type valueSet struct {
	Column  string
	Allowed []string
}

var valueSets = []valueSet{
	{"verification_status", []string{"pending", "verified", "failed"}},
	{"verification_method", []string{"dns", "http"}},
	{"ssl_status", []string{"pending", "provisioning", "active", "failed"}},
	{"ssl_provider", []string{"acme", "manual", "none"}},
}

func (v valueSet) constraint() string { return "proxy_domains_" + v.Column + "_check" }

// maxListed is how many offending rows a violation lists by id; the count says how
// many there are in all, and the fix covers them all.
const maxListed = 20

// Violation is the rows of one column whose value is outside its set.
type Violation struct {
	Column  string
	Allowed []string
	// Count is how many rows break it; Rows lists the first of them, by id.
	Count int
	Rows  []BadValue
}

// BadValue is one offending row.
type BadValue struct {
	ID    string
	Value string
}

// ViolationsError is the preflight's refusal: rows that the constraints Up is about
// to add would reject. Nothing was changed.
type ViolationsError struct {
	Violations []Violation
}

func (e *ViolationsError) Error() string {
	var b strings.Builder
	b.WriteString("proxy_domains has rows outside the value sets the schema enforces, so nothing was changed;")
	for _, v := range e.Violations {
		fmt.Fprintf(&b, " %s must be one of %s but %d row(s) are not:", v.Column, strings.Join(v.Allowed, ", "), v.Count)
		for i, r := range v.Rows {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, " %s (%q)", r.ID, r.Value)
		}
		if v.Count > len(v.Rows) {
			fmt.Fprintf(&b, " and %d more", v.Count-len(v.Rows))
		}
		fmt.Fprintf(&b, "; fix: %s;", v.fix())
	}
	b.WriteString(" then run certworker migrate again")
	return b.String()
}

// fix is an UPDATE that repairs every offending row of the column: where each bad
// value is an allowed one in another case or with spaces around it ("Active "), the
// statement that normalises them; otherwise one that the operator completes with the
// right value.
func (v Violation) fix() string {
	where := fmt.Sprintf("WHERE %s NOT IN (%s)", v.Column, quoteAll(v.Allowed))
	normalisable := len(v.Rows) == v.Count
	for _, r := range v.Rows {
		if !slices.Contains(v.Allowed, strings.ToLower(strings.TrimSpace(r.Value))) {
			normalisable = false
		}
	}
	if normalisable {
		return fmt.Sprintf("UPDATE proxy_domains SET %s = lower(btrim(%s)) %s", v.Column, v.Column, where)
	}
	return fmt.Sprintf("UPDATE proxy_domains SET %s = '<one of %s>' %s", v.Column, strings.Join(v.Allowed, ", "), where)
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = "'" + s + "'"
	}
	return strings.Join(q, ", ")
}

// Preflight looks for rows that a value-set constraint not yet in force would reject,
// and returns a *ViolationsError listing them, or nil. Only reads: it runs before any
// DDL, so that a migrate refused here has changed nothing. A column whose constraint
// exists and is validated is not read again (no row can break it), so on a migrated
// database it costs four catalogue look-ups.
func Preflight(ctx context.Context, conn *sql.Conn) error {
	var exists bool
	if err := conn.QueryRowContext(ctx, `SELECT to_regclass('proxy_domains') IS NOT NULL`).Scan(&exists); err != nil {
		return fmt.Errorf("preflight: %w", err)
	}
	if !exists {
		return nil
	}
	var found []Violation
	for _, vs := range valueSets {
		v, err := vs.check(ctx, conn)
		if err != nil {
			return fmt.Errorf("preflight %s: %w", vs.Column, err)
		}
		if v != nil {
			found = append(found, *v)
		}
	}
	if len(found) > 0 {
		return &ViolationsError{Violations: found}
	}
	return nil
}

// check reads the rows outside the set, unless the constraint already vouches for
// them. A NULL passes a CHECK, so it is not an offender here.
func (vs valueSet) check(ctx context.Context, conn *sql.Conn) (*Violation, error) {
	var validated bool
	err := conn.QueryRowContext(ctx, `
SELECT convalidated FROM pg_constraint WHERE conrelid = 'proxy_domains'::regclass AND conname = $1`,
		vs.constraint()).Scan(&validated)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, err
	}
	if validated {
		return nil, nil
	}
	// The column name comes from valueSets, never from input.
	rows, err := conn.QueryContext(ctx, fmt.Sprintf(`
SELECT count(*) OVER (), id::text, %[1]s FROM proxy_domains
WHERE %[1]s IS NOT NULL AND NOT (%[1]s = ANY ($1))
ORDER BY id LIMIT %[2]d`, vs.Column, maxListed), vs.Allowed)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	v := &Violation{Column: vs.Column, Allowed: vs.Allowed}
	for rows.Next() {
		var r BadValue
		if err := rows.Scan(&v.Count, &r.ID, &r.Value); err != nil {
			return nil, err
		}
		v.Rows = append(v.Rows, r)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if v.Count == 0 {
		return nil, nil
	}
	return v, nil
}
