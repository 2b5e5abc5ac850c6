package migrations_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/migrations"
)

// functionFiles is every file of migrations/functions, by function name.
func functionFiles(t *testing.T) map[string]string {
	t.Helper()
	names, err := fs.Glob(migrations.FS, "functions/*.sql")
	require.NoError(t, err)
	out := map[string]string{}
	for _, p := range names {
		b, err := fs.ReadFile(migrations.FS, p)
		require.NoError(t, err)
		out[strings.TrimSuffix(path.Base(p), ".sql")] = string(b)
	}
	return out
}

// definition is what the catalogue holds of the function called name.
func definition(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, name string) string {
	t.Helper()
	var def string
	require.NoError(t, q.QueryRow(context.Background(), migrations.FunctionDefinitionSQLForTest, name).Scan(&def))
	return def
}

// asItsFileHasIt is the catalogue's definition of name once its file has run, read in
// a transaction that is rolled back.
func asItsFileHasIt(t *testing.T, conn *pgx.Conn, name, file string) string {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, file)
	require.NoError(t, err, "run functions/%s.sql", name)
	return definition(t, tx, name)
}

var createFunctionRE = regexp.MustCompile(`(?im)^\s*CREATE\s+OR\s+REPLACE\s+FUNCTION\s+(?:public\.)?([a-z_][a-z0-9_]*)\s*\(`)

// Reviewers read the live definition of a function in one file, not the last of five
// re-definitions in the numbered migrations. So every certworker function in the
// catalogue of a migrated database has exactly one file under migrations/functions
// that defines it, named after it, every file defines a function the catalogue has,
// and the catalogue's definition (body, language, volatility, security, settings,
// grants, comment) is the file's.
func TestFunctions_EachHasOneFileAndTheCatalogueIsThatFile(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t)
	conn := connect(t, url)
	files := functionFiles(t)
	definedBy := map[string][]string{}
	for file, text := range files {
		for _, m := range createFunctionRE.FindAllStringSubmatch(text, -1) {
			definedBy[m[1]] = append(definedBy[m[1]], file)
		}
	}
	catalogue := lines(t, url, `SELECT DISTINCT proname::text FROM pg_proc
WHERE proname LIKE 'certworker\_%' AND pronamespace = 'public'::regnamespace ORDER BY 1`)
	require.NotEmpty(t, catalogue)
	for _, name := range catalogue {
		require.Equal(t, []string{name}, definedBy[name], "%s must be defined by exactly one file, functions/%s.sql", name, name)
		require.Equal(t, definition(t, conn, name), asItsFileHasIt(t, conn, name, files[name]),
			"the catalogue's %s is not functions/%s.sql's", name, name)
	}
	for name := range files {
		require.Contains(t, catalogue, name, "functions/%s.sql defines a function a migrated database does not have", name)
	}
}

// A function that differs from its file in the catalogue (a grant added by hand, a
// volatility changed, a body of an older binary's) is put back by the next migrate,
// and only it: the others' catalogue rows are not written (their xmin stays), so a
// migrate with nothing to do changes nothing (TestUp_ASecondRunChangesNothing).
func TestFunctions_MigratePutsBackAChangedFunctionAndOnlyIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDB(t)
	conn := connect(t, url)
	files := functionFiles(t)
	_, err := conn.Exec(ctx, `GRANT EXECUTE ON FUNCTION public.certworker_queued() TO PUBLIC;
ALTER FUNCTION public.certworker_suffixes(text) VOLATILE;`)
	require.NoError(t, err)
	require.NotEqual(t, asItsFileHasIt(t, conn, "certworker_queued", files["certworker_queued"]), definition(t, conn, "certworker_queued"))
	before := lines(t, url, `SELECT proname || ' ' || xmin FROM pg_proc WHERE proname LIKE 'certworker\_%' ORDER BY 1`)

	results, err := migrations.Up(ctx, openDB(t, url), migrations.Options{})
	require.NoError(t, err)
	var sources []string
	for _, r := range results {
		sources = append(sources, r.Source)
	}
	slices.Sort(sources)
	require.Equal(t, []string{"functions/certworker_queued.sql", "functions/certworker_suffixes.sql"}, sources)
	for _, name := range []string{"certworker_queued", "certworker_suffixes"} {
		require.Equal(t, asItsFileHasIt(t, conn, name, files[name]), definition(t, conn, name), "%s was not put back", name)
	}
	after := lines(t, url, `SELECT proname || ' ' || xmin FROM pg_proc WHERE proname LIKE 'certworker\_%' ORDER BY 1`)
	for i := range before {
		if strings.HasPrefix(before[i], "certworker_queued ") || strings.HasPrefix(before[i], "certworker_suffixes ") {
			require.NotEqual(t, before[i], after[i])
			continue
		}
		require.Equal(t, before[i], after[i], "a function that matched its file was written again")
	}
	results, err = migrations.Up(ctx, openDB(t, url), migrations.Options{})
	require.NoError(t, err)
	require.Empty(t, results)
}

// generation is this binary's generation of the functions.
func generation(t *testing.T) int {
	t.Helper()
	b, err := fs.ReadFile(migrations.FS, "functions/functions.sum")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^generation (\d+)$`).FindStringSubmatch(string(b))
	require.NotNil(t, m)
	g, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	return g
}

// During a rolling deploy a newer binary migrated the database, and an older one's
// migrate runs (a restart of an old pod): it must not put its old bodies back. It
// leaves every function alone, says so, and its run refuses to start (exit 2 through
// Check), naming the newer binary.
func TestFunctions_AnOlderBinaryLeavesTheNewerFunctionsAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDB(t)
	conn := connect(t, url)
	// What a newer binary would have left: another body, recorded with a newer
	// generation.
	_, err := conn.Exec(ctx, `ALTER FUNCTION public.certworker_suffixes(text) SET work_mem = '1MB';
UPDATE certworker_functions SET generation = generation + 1,
    sha256 = CASE WHEN name = 'certworker_suffixes' THEN 'newer' ELSE sha256 END`)
	require.NoError(t, err)
	newer := definition(t, conn, "certworker_suffixes")

	var notices []string
	results, err := migrations.Up(ctx, openDB(t, url), migrations.Options{OnNotice: func(s string) { notices = append(notices, s) }})
	require.NoError(t, err)
	require.Empty(t, results)
	require.Equal(t, []string{fmt.Sprintf("the database's functions are newer than this binary's (generation %d, this binary's %d): left alone",
		generation(t)+1, generation(t))}, notices)
	require.Equal(t, newer, definition(t, conn, "certworker_suffixes"), "the older binary put its body back")
	require.Equal(t, []string{"newer"}, lines(t, url, `SELECT sha256 FROM certworker_functions WHERE name = 'certworker_suffixes'`))

	err = migrations.Check(ctx, openDB(t, url))
	var ferr *migrations.FunctionsError
	require.ErrorAs(t, err, &ferr)
	require.True(t, ferr.Ahead())
	require.Contains(t, err.Error(), "run the newer certworker, not this one")
}

// A database whose functions were applied by an older binary (its record names
// another hash) is not this binary's: run refuses it until this binary's migrate has
// run, which records its own.
func TestCheck_FunctionsOfAnOlderBinaryAreRefusedUntilMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDB(t)
	_, err := connect(t, url).Exec(ctx, `UPDATE certworker_functions SET sha256 = 'older', generation = 0 WHERE name = 'certworker_queued'`)
	require.NoError(t, err)
	err = migrations.Check(ctx, openDB(t, url))
	var ferr *migrations.FunctionsError
	require.ErrorAs(t, err, &ferr)
	require.False(t, ferr.Ahead())
	require.Equal(t, "certworker_queued", ferr.Function)
	require.Contains(t, err.Error(), "run `certworker migrate` with this binary first")

	_, err = migrations.Up(ctx, openDB(t, url), migrations.Options{})
	require.NoError(t, err)
	require.NoError(t, migrations.Check(ctx, openDB(t, url)))
}

// The functions step is online: replacing the function of a trigger of the proxy's
// tables writes only the catalogue, so it finishes while a transaction of the proxy's
// holds those tables in ACCESS EXCLUSIVE mode, which any lock on them would wait for.
func TestFunctions_TheStepTakesNoLockOnTheProxysTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDB(t)
	conn := connect(t, url)
	_, err := conn.Exec(ctx, `ALTER FUNCTION public.certworker_queued() SET work_mem = '1MB';
ALTER FUNCTION public.certworker_certificate_changed() SET work_mem = '1MB'`)
	require.NoError(t, err)

	proxy := connect(t, url)
	tx, err := proxy.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `LOCK TABLE proxy_domains, proxy_certificates IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	db := openDB(t, url)
	guard, err := db.Conn(ctx)
	require.NoError(t, err)
	defer guard.Close()
	_, err = guard.ExecContext(ctx, `SET lock_timeout = '500ms'`)
	require.NoError(t, err)
	stepCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	results, err := migrations.ApplyFunctionsForTest(stepCtx, guard, nil)
	require.NoError(t, err, "the functions step waited for a lock on the proxy's tables")
	var sources []string
	for _, r := range results {
		sources = append(sources, r.Source)
	}
	slices.Sort(sources)
	require.Equal(t, []string{"functions/certworker_certificate_changed.sql", "functions/certworker_queued.sql"}, sources)
}

// functions.sum has each file's hash, under a generation bumped with every change:
// the generation is how an older binary tells that the database's functions are newer
// than its own. With UPDATE_FUNCTIONS_SUM=1 this writes the file (bumping the
// generation once when a hash changed) instead of failing.
func TestFunctions_SumIsCurrent(t *testing.T) {
	dir := "functions"
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	sum, err := os.ReadFile(path.Join(dir, "functions.sum"))
	require.NoError(t, err)
	var header []string
	recorded := map[string]string{}
	gen := 0
	for _, line := range strings.Split(strings.TrimRight(string(sum), "\n"), "\n") {
		f := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "#") || line == "":
			header = append(header, line)
		case len(f) == 2 && f[0] == "generation":
			gen, err = strconv.Atoi(f[1])
			require.NoError(t, err)
		case len(f) == 2:
			recorded[f[0]] = f[1]
		default:
			t.Fatalf("functions.sum: a line that is neither a comment, the generation nor NAME SHA256: %q", line)
		}
	}
	want := map[string]string{}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		b, err := os.ReadFile(path.Join(dir, e.Name()))
		require.NoError(t, err)
		h := sha256.Sum256(b)
		want[strings.TrimSuffix(e.Name(), ".sql")] = hex.EncodeToString(h[:])
	}
	if fmt.Sprint(want) == fmt.Sprint(recorded) {
		return
	}
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, h := range header {
		b.WriteString(h + "\n")
	}
	fmt.Fprintf(&b, "generation %d\n", gen+1)
	for _, n := range names {
		fmt.Fprintf(&b, "%s %s\n", n, want[n])
	}
	if os.Getenv("UPDATE_FUNCTIONS_SUM") == "1" {
		require.NoError(t, os.WriteFile(path.Join(dir, "functions.sum"), []byte(b.String()), 0o644))
		return
	}
	t.Fatalf("migrations/functions changed without functions.sum: bump the generation and record the hashes "+
		"(UPDATE_FUNCTIONS_SUM=1 go test -run TestFunctions_SumIsCurrent ./migrations), to:\n%s", b.String())
}
