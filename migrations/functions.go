package migrations

import (
	"bufio"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The functions step: the current definition of every certworker function lives in
// one file, functions/NAME.sql, applied after the numbered migrations on every
// migrate, as Flyway's repeatable migrations are. A file holds one CREATE OR REPLACE
// FUNCTION and the statements that belong with it (REVOKE, GRANT, COMMENT ON
// FUNCTION). Changing a function is editing its file (and functions.sum): no new
// numbered migration, unless its signature changes.
//
//   - Online: CREATE OR REPLACE FUNCTION writes only the catalogue and locks none of
//     the proxy's tables; a trigger keeps firing the old body until the transaction
//     that replaces it commits.
//   - A function is replaced only when its definition in the catalogue (body,
//     language, volatility, security, settings, grants, comment) differs from its
//     file, so a second migrate changes nothing: each file is run in a transaction
//     that reads the catalogue's definition before and after, and rolls back when the
//     two are the same.
//   - An older binary does not put old bodies back. certworker_functions records the
//     hash of each file applied and the generation of the binary that applied it
//     (functions.sum, bumped with every change of a file); a migrate whose generation
//     is older than the database's leaves the functions alone, and Check (so `run`)
//     refuses a database whose recorded hashes are not this binary's.
//
// A numbered migration that attaches a new function (CREATE TRIGGER ... EXECUTE
// FUNCTION) creates a stub of it first; this step then replaces the stub.

// functionsSum is the file that holds the generation and each file's SHA-256.
const functionsSum = "functions/functions.sum"

// functionFile is one file of migrations/functions.
type functionFile struct {
	// Name is the function's name (the file's, without .sql).
	Name string
	// Path is the file's path in FS.
	Path string
	// SQL is the file's text.
	SQL string
	// Sum is the file's SHA-256, in hex.
	Sum string
}

// functionSet is the embedded functions and their generation.
type functionSet struct {
	Generation int
	Files      []functionFile
}

// createFunctionRE finds the function a file defines.
var createFunctionRE = regexp.MustCompile(`(?im)^\s*CREATE\s+OR\s+REPLACE\s+FUNCTION\s+(?:public\.)?([a-z_][a-z0-9_]*)\s*\(`)

// embeddedFunctions reads the function files and functions.sum of fsys (a release's
// migrations, FS for this binary's), and checks
// that they agree: one CREATE OR REPLACE FUNCTION per file, of the function the file
// is named after, and each file's hash as functions.sum has it. A file changed without
// its line in functions.sum is refused (TestFunctions_SumIsCurrent says what to
// write), since the generation would not tell binaries apart.
func embeddedFunctions(fsys fs.FS) (functionSet, error) {
	var set functionSet
	names, err := fs.Glob(fsys, "functions/*.sql")
	if err != nil {
		return set, fmt.Errorf("list functions: %w", err)
	}
	sums, gen, err := readFunctionsSum(fsys)
	if err != nil {
		return set, err
	}
	set.Generation = gen
	for _, p := range names {
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return set, fmt.Errorf("read %s: %w", p, err)
		}
		f := functionFile{Name: strings.TrimSuffix(path.Base(p), ".sql"), Path: p, SQL: string(b), Sum: fileSum(b)}
		defined := createFunctionRE.FindAllStringSubmatch(f.SQL, -1)
		if len(defined) != 1 || defined[0][1] != f.Name {
			return set, fmt.Errorf("%s must hold exactly one CREATE OR REPLACE FUNCTION, of %s", p, f.Name)
		}
		if sums[f.Name] != f.Sum {
			return set, fmt.Errorf("%s does not match %s: bump its generation and record the file's hash there", p, functionsSum)
		}
		set.Files = append(set.Files, f)
	}
	for name := range sums {
		if !slices.ContainsFunc(set.Files, func(f functionFile) bool { return f.Name == name }) {
			return set, fmt.Errorf("%s names %s, which has no file", functionsSum, name)
		}
	}
	return set, nil
}

// fileSum is the SHA-256 of a function file, in hex.
func fileSum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// readFunctionsSum parses functions.sum: "generation N", then "NAME SHA256" lines;
// blank lines and lines starting with # are comments.
func readFunctionsSum(fsys fs.FS) (map[string]string, int, error) {
	b, err := fs.ReadFile(fsys, functionsSum)
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", functionsSum, err)
	}
	sums := map[string]string{}
	gen := 0
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, 0, fmt.Errorf("%s:%d: want two fields, got %q", functionsSum, n, line)
		}
		if fields[0] == "generation" {
			gen, err = strconv.Atoi(fields[1])
			if err != nil || gen < 1 {
				return nil, 0, fmt.Errorf("%s:%d: generation must be a positive number, got %q", functionsSum, n, fields[1])
			}
			continue
		}
		sums[fields[0]] = fields[1]
	}
	if gen == 0 {
		return nil, 0, fmt.Errorf("%s has no generation line", functionsSum)
	}
	return sums, gen, nil
}

// functionDefinitionSQL is what the catalogue holds of a function: everything
// pg_get_functiondef prints (arguments, result, language, volatility, strictness,
// security, settings, body), its grants and its comment. $1 is the name; every
// overload, in order of signature.
const functionDefinitionSQL = `
SELECT COALESCE(string_agg(
    pg_catalog.pg_get_functiondef(p.oid) || E'\n-- acl ' || COALESCE(p.proacl::text, 'default')
    || E'\n-- comment ' || COALESCE(pg_catalog.obj_description(p.oid, 'pg_proc'), ''),
    E'\n' ORDER BY p.oid::regprocedure::text), '')
FROM pg_catalog.pg_proc p
WHERE p.proname = $1 AND p.pronamespace = 'public'::regnamespace`

// recordedFunction is a row of certworker_functions.
type recordedFunction struct {
	Sum        string
	Generation int
}

// readRecordedFunctions reads certworker_functions; a database without the table
// (never migrated by a binary that has the functions step) has none.
func readRecordedFunctions(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}) (map[string]recordedFunction, error) {
	rows, err := q.QueryContext(ctx, `SELECT name, sha256, generation FROM certworker_functions`)
	if isUndefinedTable(err) {
		return map[string]recordedFunction{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the recorded functions: %w", err)
	}
	defer rows.Close()
	out := map[string]recordedFunction{}
	for rows.Next() {
		var name string
		var r recordedFunction
		if err := rows.Scan(&name, &r.Sum, &r.Generation); err != nil {
			return nil, fmt.Errorf("read the recorded functions: %w", err)
		}
		out[name] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the recorded functions: %w", err)
	}
	return out, nil
}

// newestGeneration is the highest generation recorded (0 for none).
func newestGeneration(recorded map[string]recordedFunction) int {
	g := 0
	for _, r := range recorded {
		g = max(g, r.Generation)
	}
	return g
}

// applyFunctions is the functions step, run on guard (which holds the migration lock
// and the lock timeout) once every numbered migration has run. It returns a Result for
// each function it replaced, and calls notice when it leaves the functions of a
// database that a newer binary migrated alone.
func applyFunctions(ctx context.Context, guard *sql.Conn, notice func(string)) ([]Result, error) {
	return applyFunctionsOf(ctx, guard, FS, notice)
}

// applyFunctionsOf is applyFunctions with the function files of fsys.
func applyFunctionsOf(ctx context.Context, guard *sql.Conn, fsys fs.FS, notice func(string)) ([]Result, error) {
	set, err := embeddedFunctions(fsys)
	if err != nil {
		return nil, err
	}
	recorded, err := readRecordedFunctions(ctx, guard)
	if err != nil {
		return nil, err
	}
	if g := newestGeneration(recorded); g > set.Generation {
		if notice != nil {
			notice(fmt.Sprintf("the database's functions are newer than this binary's (generation %d, this binary's %d): left alone", g, set.Generation))
		}
		return nil, nil
	}
	var out []Result
	for _, f := range set.Files {
		replaced, took, err := applyFunction(ctx, guard, f, set.Generation, recorded[f.Name])
		if err != nil {
			return out, fmt.Errorf("apply %s: %w", f.Path, err)
		}
		if replaced {
			out = append(out, Result{Source: f.Path, Duration: took.String()})
		}
	}
	// A function dropped by a numbered migration has no file any more: forget it.
	for name := range recorded {
		if slices.ContainsFunc(set.Files, func(f functionFile) bool { return f.Name == name }) {
			continue
		}
		if _, err := guard.ExecContext(ctx, `DELETE FROM certworker_functions WHERE name = $1`, name); err != nil {
			return out, fmt.Errorf("forget function %s: %w", name, err)
		}
	}
	return out, nil
}

// applyFunction runs one file in a transaction and keeps what it did only when the
// catalogue's definition changed, or when the record of it is not this binary's.
func applyFunction(ctx context.Context, guard *sql.Conn, f functionFile, generation int, rec recordedFunction) (replaced bool, took time.Duration, err error) {
	start := time.Now()
	tx, err := guard.BeginTx(ctx, nil)
	if err != nil {
		return false, 0, err
	}
	defer func() { _ = tx.Rollback() }()
	// A LANGUAGE sql body is checked when it is created, which takes ACCESS SHARE on
	// every table it reads and so waits behind any lock of the proxy's (pg_dump turns
	// the check off for the same reason). The tests run every file with the check on.
	if _, err := tx.ExecContext(ctx, `SET LOCAL check_function_bodies = off`); err != nil {
		return false, 0, err
	}
	var before, after string
	if err := tx.QueryRowContext(ctx, functionDefinitionSQL, f.Name).Scan(&before); err != nil {
		return false, 0, fmt.Errorf("read its definition: %w", err)
	}
	// No arguments: the simple protocol, which runs the file's several statements.
	if _, err := tx.ExecContext(ctx, f.SQL); err != nil {
		return false, 0, err
	}
	if err := tx.QueryRowContext(ctx, functionDefinitionSQL, f.Name).Scan(&after); err != nil {
		return false, 0, fmt.Errorf("read its definition: %w", err)
	}
	replaced = before != after
	if !replaced && rec.Sum == f.Sum && rec.Generation == generation {
		return false, 0, nil // the rollback leaves the catalogue as it was
	}
	if _, err := tx.ExecContext(ctx, `
INSERT INTO certworker_functions (name, sha256, generation) VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE SET sha256 = EXCLUDED.sha256, generation = EXCLUDED.generation, applied_at = now()`,
		f.Name, f.Sum, generation); err != nil {
		return false, 0, fmt.Errorf("record it: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return false, 0, err
	}
	return replaced, time.Since(start), nil
}

// FunctionsError: the functions in the database are not the ones this binary was
// built with. Ahead when a newer binary's migrate applied them (run the newer
// binary), otherwise this binary's migrate has not run since they changed.
type FunctionsError struct {
	// Function is the first function that differs.
	Function string
	// Generation is the newest generation the database records (0 for none).
	Generation int
	// Want is this binary's.
	Want int
}

// Ahead reports whether a newer binary applied the database's functions.
func (e *FunctionsError) Ahead() bool { return e.Generation > e.Want }

func (e *FunctionsError) Error() string {
	if e.Ahead() {
		return fmt.Sprintf("the database's functions are ahead of this binary (a newer certworker applied generation %d of them; this binary has generation %d): run the newer certworker, not this one",
			e.Generation, e.Want)
	}
	return fmt.Sprintf("function %s in the database is not the one this binary was built with (the database records generation %d of the functions, this binary has %d): run `certworker migrate` with this binary first",
		e.Function, e.Generation, e.Want)
}

// checkFunctions compares what certworker_functions records with the files of fsys:
// nil when every function is this binary's, a *FunctionsError when one is not. With
// newer (a database the next release migrated, within this binary's window), a
// newer generation's bodies are accepted: that release keeps what this one relies on.
// A function of this binary's that the database lacks never is.
func checkFunctions(ctx context.Context, db *sql.DB, fsys fs.FS, newer bool) error {
	set, err := embeddedFunctions(fsys)
	if err != nil {
		return err
	}
	recorded, err := readRecordedFunctions(ctx, db)
	if err != nil {
		return err
	}
	newest := newestGeneration(recorded)
	newer = newer && newest > set.Generation
	for _, f := range set.Files {
		r, ok := recorded[f.Name]
		if !ok || (r.Sum != f.Sum && !newer) {
			return &FunctionsError{Function: f.Name, Generation: newest, Want: set.Generation}
		}
	}
	if newer {
		return nil
	}
	if newest > set.Generation {
		return &FunctionsError{Generation: newest, Want: set.Generation}
	}
	return nil
}

// isUndefinedTable reports whether err is SQLSTATE 42P01 (undefined_table).
func isUndefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}
