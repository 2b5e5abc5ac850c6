package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// grantsFile holds every grant `run` needs (docs/security.md, "Least privilege").
const grantsFile = "../../deploy/grants.sql"

// tableFile lists the same grants in a table, with the columns `run` may not read.
const tableFile = "../../docs/security.md"

// `run` works under a role that holds only deploy/grants.sql's rights: it starts,
// reports ready, issues a certificate from Pebble and stops cleanly. With --wake
// logical the replication connection is a role of its own holding REPLICATION and
// nothing else (--replication-database-url), and the workers' role holds no
// REPLICATION. Guards against a grant list that falls behind the code (the binary
// would log "permission denied" and never issue); TestGrants_WorkersCannotTouchWhat
// TheProxyOwns guards against one that grants more than the worker uses.
func TestRun_IssuesUnderLeastPrivilege(t *testing.T) {
	t.Parallel()
	bin := buildCertworker(t)
	for _, wake := range []string{"notify", "logical"} {
		t.Run(wake, func(t *testing.T) {
			t.Parallel()
			var adminDSN string
			if wake == "logical" {
				adminDSN = pgtest.StartServer(t, "wal_level=logical").NewDatabase(t)
			} else {
				adminDSN = pgtest.NewDB(t)
			}
			runDSN := leastPrivilegeRole(t, adminDSN)
			var extra []string
			if wake == "logical" {
				_, wakeDSN := newRole(t, adminDSN, "certworker_wake", "REPLICATION")
				extra = []string{"--replication-database-url", wakeDSN}
			}
			issueThroughBinary(t, bin, adminDSN, runDSN, wake, extra...)
		})
	}
}

// buildCertworker builds this command once for the package's tests (each link of it
// is seconds of a busy machine's CPU) and returns the binary's path; TestMain removes
// it.
func buildCertworker(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "certworker-cmd-test-")
		if err != nil {
			built.err = err
			return
		}
		built.dir, built.bin = dir, filepath.Join(dir, "certworker")
		if out, err := exec.Command("go", "build", "-trimpath", "-o", built.bin, ".").CombinedOutput(); err != nil {
			built.err = fmt.Errorf("%v: %s", err, out)
		}
	})
	require.NoError(t, built.err, "build certworker")
	return built.bin
}

var built struct {
	once     sync.Once
	dir, bin string
	err      error
}

// newRole creates a login role named prefix plus a random suffix, with attrs (such
// as REPLICATION) and no grant, on adminDSN's server, dropped when the test ends; it
// returns its name and a URL of adminDSN's database that connects as it.
func newRole(t *testing.T, adminDSN, prefix, attrs string) (string, string) {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, adminDSN)
	require.NoError(t, err)
	defer admin.Close(ctx)
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := prefix + "_" + hex.EncodeToString(b[:])
	_, err = admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN PASSWORD 'run-secret' "+attrs)
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), adminDSN)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = c.Exec(context.Background(), "DROP ROLE "+role)
	})
	u, err := url.Parse(adminDSN)
	require.NoError(t, err)
	u.User = url.UserPassword(role, "run-secret")
	return role, u.String()
}

// leastPrivilegeRole creates a login role holding only deploy/grants.sql's rights on
// adminDSN's database and returns a URL that connects as it. The role is dropped
// when the test ends.
func leastPrivilegeRole(t *testing.T, adminDSN string) string {
	t.Helper()
	role, runDSN := newRole(t, adminDSN, "certworker_run", "")
	workers, _ := grantsSections(t)
	execSQL(t, adminDSN, strings.ReplaceAll(workers, `:"role"`, `"`+role+`"`))
	return runDSN
}

// grantsSections are deploy/grants.sql's two parts: the workers' grants (:"role"), and
// the proxy's role's (:"proxy_role"), which psql runs only when proxy_role is set.
func grantsSections(t *testing.T) (workers, proxy string) {
	t.Helper()
	text, err := os.ReadFile(grantsFile)
	require.NoError(t, err)
	workers, rest, ok := strings.Cut(string(text), "\n\\if :{?proxy_role}\n")
	require.True(t, ok, "%s has no section \\if :{?proxy_role} for the proxy's role", grantsFile)
	proxy, _, ok = strings.Cut(rest, "\n\\endif")
	require.True(t, ok, "%s: the proxy's section has no \\endif", grantsFile)
	return workers, proxy
}

// The workers' role may not change what the proxy owns, nor read what certworker
// never reads: each statement is refused with SQLSTATE 42501, whatever rows it would
// touch. Before the grants were by column it could move a domain to another tenant,
// rename it, verify it, and read every private key (issue 16).
func TestGrants_WorkersCannotTouchWhatTheProxyOwns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	adminDSN := pgtest.NewDB(t)
	execSQL(t, adminDSN, `
WITH t AS (INSERT INTO proxy_tenants (name, slug, email) VALUES ('shop', 'shop', 'shop@example.com') RETURNING id)
INSERT INTO proxy_domains (tenant_id, domain, verification_token) SELECT id, 'shop.example', 'tok' FROM t;
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem) VALUES ('shop.example', 'pem', 'key')`)
	conn, err := pgx.Connect(ctx, leastPrivilegeRole(t, adminDSN))
	require.NoError(t, err)
	defer conn.Close(ctx)

	// What the worker does: so that a refusal below is the column's, not the role's.
	_, err = conn.Exec(ctx, `UPDATE proxy_domains SET ssl_error = ssl_error, updated_at = now() WHERE domain = 'shop.example'`)
	require.NoError(t, err)
	for _, stmt := range []string{
		`UPDATE proxy_domains SET tenant_id = gen_random_uuid() WHERE domain = 'shop.example'`,
		`UPDATE proxy_domains SET domain = 'stolen.example' WHERE domain = 'shop.example'`,
		`UPDATE proxy_domains SET verification_status = 'verified' WHERE domain = 'shop.example'`,
		`UPDATE proxy_domains SET verification_method = 'http', verification_token = 'mine' WHERE domain = 'shop.example'`,
		`SELECT verification_token FROM proxy_domains`,
		`SELECT * FROM proxy_domains`,
		`INSERT INTO proxy_domains (tenant_id, domain, verification_token) VALUES (gen_random_uuid(), 'x.example', 't')`,
		`DELETE FROM proxy_domains`,
		`SELECT private_key_pem FROM proxy_certificates`,
		`SELECT domain FROM certworker_certificate_for('shop.example')`, // it reads the keys
		`UPDATE proxy_certificates SET domain = 'stolen.example'`,
		`UPDATE proxy_certificates SET auto_renew = false`,
		`TRUNCATE proxy_certificates`,
		`SELECT count(*) FROM proxy_tenants`,
		`UPDATE proxy_tenants SET name = name`,
		`SELECT certworker_queued()`,
		`CREATE TABLE certworker_scratch (id int)`,
		`ALTER TABLE proxy_domains ADD COLUMN scratch int`,
		`TRUNCATE certworker_http01_tokens`,
		`UPDATE certworker_ledger SET at = now()`,
	} {
		_, err := conn.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: want permission denied, got %v", stmt, err)
		require.Equal(t, "42501", pgErr.Code, "%s: %s", stmt, pgErr.Message)
	}
}

// `status` works under the workers' role; `retry`, which runs the proxy's own
// operation (whole rows of proxy_domains), fails with exit 1 and says which role it
// needs. Guards against `status` reading a column the role may not read (it read
// SELECT *), and against retry's refusal being a bare "permission denied".
func TestGrants_StatusWorksUnderTheWorkersRoleAndRetryNamesTheRoleItNeeds(t *testing.T) {
	t.Parallel()
	adminDSN := pgtest.NewDB(t)
	execSQL(t, adminDSN, `
WITH t AS (INSERT INTO proxy_tenants (name, slug, email) VALUES ('shop', 'shop', 'shop@example.com') RETURNING id)
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_attempts, ssl_error)
SELECT id, 'failed.example', 'verified', 'tok', 'failed', 10, 'acme: boom' FROM t`)
	runDSN := leastPrivilegeRole(t, adminDSN)

	code, stdout, stderr := invoke(t, "status", "--database-url", runDSN)
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "failed.example")
	code, stdout, stderr = invoke(t, "status", "--json", "failed.example", "--database-url", runDSN)
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, `"ssl_error": "acme: boom"`)

	code, _, stderr = invoke(t, "retry", "failed.example", "--database-url", runDSN)
	require.Equal(t, exitFailed, code)
	require.Contains(t, stderr, "needs the proxy's rights on proxy_domains")
	require.NotContains(t, stderr, "run-secret")
	code, _, stderr = invoke(t, "retry", "failed.example", "--database-url", adminDSN)
	require.Equal(t, exitOK, code, stderr)
}

// The renewal-information reads work under the workers' role: claiming a due read
// and recording what the CA said, which checks the certificate's serial and version.
// Guards against a grant the issuance test cannot reach (the reads fall due hours
// after a certificate is stored): the version column was "not readable", and every
// read failed with 42501 in production.
func TestGrants_RenewalInformationWorksUnderTheWorkersRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	adminDSN := pgtest.NewDB(t)
	execSQL(t, adminDSN, `
WITH t AS (INSERT INTO proxy_tenants (name, slug, email) VALUES ('shop', 'shop', 'shop@example.com') RETURNING id)
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status)
SELECT id, 'ari.example', 'verified', 'tok', 'active' FROM t;
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at, not_before, serial,
    renew_at, ari_next_at)
VALUES ('ari.example', 'pem', 'key', now() + interval '60 days', now() - interval '30 days', '0a',
    now() + interval '30 days', now() - interval '1 minute')`)
	pool, err := pgxpool.New(ctx, leastPrivilegeRole(t, adminDSN))
	require.NoError(t, err)
	defer pool.Close()
	q := queue.New(pool, issuing.DefaultConfig())

	reads, _, err := q.ClaimRenewalInfo(ctx, 4)
	require.NoError(t, err)
	require.Len(t, reads, 1)
	_, err = q.RecordRenewalInfo(ctx, reads[0], issuing.RenewalInfo{NextIn: time.Hour})
	require.NoError(t, err)
}

// grant is one privilege on an object (a table, or "schema NAME"), on one column or,
// with column "", on the whole object.
type grant struct{ object, privilege, column string }

func (g grant) String() string {
	if g.column == "" {
		return g.privilege + " ON " + g.object
	}
	return g.privilege + " (" + g.column + ") ON " + g.object
}

var (
	grantStmt = regexp.MustCompile(`(?is)^GRANT\s+(.+?)\s+ON\s+(?:(TABLE|SCHEMA)\s+)?(.+?)\s+TO\s+:"role"$`)
	privItem  = regexp.MustCompile(`(?s)^([A-Za-z]+)\s*(?:\((.*)\))?$`)
)

// parseGrantsSQL reads deploy/grants.sql: GRANT PRIV[ (COL, ...)][, ...] ON [TABLE |
// SCHEMA ]OBJ[, ...] TO :"role"; and nothing else but comments.
func parseGrantsSQL(t *testing.T, text string) map[grant]bool {
	t.Helper()
	var b strings.Builder
	for _, line := range strings.Split(text, "\n") {
		line, _, _ = strings.Cut(line, "--")
		b.WriteString(line + "\n")
	}
	out := map[grant]bool{}
	for _, stmt := range strings.Split(b.String(), ";") {
		stmt = strings.Join(strings.Fields(stmt), " ")
		if stmt == "" {
			continue
		}
		m := grantStmt.FindStringSubmatch(stmt)
		require.NotNil(t, m, "%s: cannot read %q (the test reads GRANT PRIV [(COLUMNS)], ... ON [TABLE|SCHEMA] OBJECT TO :\"role\")", grantsFile, stmt)
		for _, obj := range strings.Split(m[3], ",") {
			obj = strings.TrimSpace(obj)
			if strings.EqualFold(m[2], "SCHEMA") {
				obj = "schema " + obj
			}
			for _, item := range splitTopLevel(m[1]) {
				p := privItem.FindStringSubmatch(strings.TrimSpace(item))
				require.NotNil(t, p, "%s: cannot read privilege %q", grantsFile, item)
				priv := strings.ToUpper(p[1])
				if p[2] == "" {
					out[grant{obj, priv, ""}] = true
					continue
				}
				for _, col := range strings.Split(p[2], ",") {
					out[grant{obj, priv, strings.TrimSpace(col)}] = true
				}
			}
		}
	}
	return out
}

// splitTopLevel splits s at the commas outside parentheses.
func splitTopLevel(s string) []string {
	var out []string
	depth, from := 0, 0
	for i, r := range s {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[from:i])
				from = i + 1
			}
		}
	}
	return append(out, s[from:])
}

// notReadable is the table's privilege for the columns `run` may not read.
const notReadable = "not readable"

// parseGrantsTable reads the table of docs/security.md's "Least privilege": its
// grants, and the columns listed as not readable (privilege notReadable).
func parseGrantsTable(t *testing.T, text string) (granted, unreadable map[grant]bool) {
	t.Helper()
	_, section, ok := strings.Cut(text, "\n## Least privilege\n")
	require.True(t, ok, "%s has no section \"Least privilege\"", tableFile)
	section, _, _ = strings.Cut(section, "\n## ")
	_, table, ok := strings.Cut(section, "\n| object | privilege | columns |")
	require.True(t, ok, "%s: no table headed | object | privilege | columns | in \"Least privilege\"", tableFile)
	granted, unreadable = map[grant]bool{}, map[grant]bool{}
	for _, line := range strings.Split(table, "\n")[1:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		if strings.HasPrefix(line, "|---") {
			continue
		}
		cells := strings.Split(line, "|")
		require.GreaterOrEqual(t, len(cells), 5, "%s: row %q", tableFile, line)
		obj := strings.ReplaceAll(strings.TrimSpace(cells[1]), "`", "")
		priv := strings.TrimSpace(cells[2])
		into := granted
		if priv == notReadable {
			into = unreadable
		}
		cols := strings.TrimSpace(cells[3])
		if cols == "all" {
			into[grant{obj, priv, ""}] = true
			continue
		}
		for _, col := range strings.Split(cols, ",") {
			col = strings.Trim(strings.TrimSpace(col), "`")
			require.NotEmpty(t, col, "%s: row %q", tableFile, line)
			into[grant{obj, priv, col}] = true
		}
	}
	require.NotEmpty(t, granted, "%s: the table of \"Least privilege\" has no rows", tableFile)
	return granted, unreadable
}

func readGrants(t *testing.T) (sqlGrants, tableGrants, unreadable map[grant]bool) {
	t.Helper()
	sqlText, _ := grantsSections(t)
	page, err := os.ReadFile(tableFile)
	require.NoError(t, err)
	tableGrants, unreadable = parseGrantsTable(t, string(page))
	return parseGrantsSQL(t, sqlText), tableGrants, unreadable
}

// missing lists what a has and b lacks, sorted.
func missing(a, b map[grant]bool) []string {
	var out []string
	for g := range a {
		if !b[g] {
			out = append(out, g.String())
		}
	}
	sort.Strings(out)
	return out
}

// docs/security.md's table of privileges says what deploy/grants.sql grants, no more
// and no less, so that an operator reading one reads the other. Guards against the
// drift the table had when it was in the README: it lacked three tables' grants and
// DELETE on proxy_certificates.
func TestGrants_SecurityPageTableIsGrantsSQL(t *testing.T) {
	t.Parallel()
	sqlGrants, tableGrants, _ := readGrants(t)
	require.Empty(t, missing(sqlGrants, tableGrants), "%s grants these, and the table of docs/security.md's \"Least privilege\" does not list them", grantsFile)
	require.Empty(t, missing(tableGrants, sqlGrants), "the table of docs/security.md's \"Least privilege\" lists these, and %s does not grant them", grantsFile)
}

// Every column of every table of the migrated schema is either readable by the
// workers (SELECT in deploy/grants.sql) or listed as not readable in the table of
// docs/security.md: a column a migration adds must be decided on, or this fails naming it. And the
// grants PostgreSQL records once grants.sql has run are exactly the ones the tests
// read from it.
func TestGrants_EveryColumnIsGrantedOrNotReadable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sqlGrants, tableGrants, unreadable := readGrants(t)
	adminDSN := pgtest.NewDB(t)
	admin, err := pgx.Connect(ctx, adminDSN)
	require.NoError(t, err)
	defer admin.Close(ctx)
	rows, err := admin.Query(ctx, `
SELECT c.relname::text, a.attname::text FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY 1, a.attnum`)
	require.NoError(t, err)
	columns := map[string][]string{}
	var table, col string
	_, err = pgx.ForEachRow(rows, []any{&table, &col}, func() error {
		columns[table] = append(columns[table], col)
		return nil
	})
	require.NoError(t, err)
	for table, cols := range columns {
		listed := unreadable[grant{table, notReadable, ""}] || sqlGrants[grant{table, "SELECT", ""}]
		for _, col := range cols {
			readable := sqlGrants[grant{table, "SELECT", col}]
			hidden := unreadable[grant{table, notReadable, col}]
			listed = listed || readable || hidden
			assert.False(t, readable && hidden, "%s.%s is granted SELECT in %s and listed as not readable in %s", table, col, grantsFile, tableFile)
			if !readable && !hidden && !unreadable[grant{table, notReadable, ""}] && !sqlGrants[grant{table, "SELECT", ""}] {
				assert.Fail(t, "a column nobody decided on",
					"%s.%s is neither granted SELECT to the workers in %s nor listed as not readable in the table of %s's \"Least privilege\": "+
						"if certworker run reads it, add it to the SELECT grant of both (and to UPDATE if run writes it); if not, list it as not readable",
					table, col, grantsFile, tableFile)
			}
		}
		assert.True(t, listed, "table %s is in no row of the table of %s's \"Least privilege\": grant what run needs, or list it as not readable (all)", table, tableFile)
	}
	for g := range unreadable {
		if g.column != "" {
			assert.Contains(t, columns[g.object], g.column, "%s lists %s.%s as not readable: no such column", tableFile, g.object, g.column)
		}
	}

	role, _ := newRole(t, adminDSN, "certworker_run", "")
	text, _ := grantsSections(t)
	_, err = admin.Exec(ctx, strings.ReplaceAll(text, `:"role"`, `"`+role+`"`))
	require.NoError(t, err)
	rows, err = admin.Query(ctx, `
SELECT c.relname::text, p.privilege_type, '' FROM pg_class c, aclexplode(c.relacl) p
WHERE c.relnamespace = 'public'::regnamespace AND p.grantee = $1::regrole
UNION ALL
SELECT c.relname::text, p.privilege_type, a.attname::text
FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid, aclexplode(a.attacl) p
WHERE c.relnamespace = 'public'::regnamespace AND p.grantee = $1::regrole
UNION ALL
SELECT 'schema ' || n.nspname, p.privilege_type, '' FROM pg_namespace n, aclexplode(n.nspacl) p
WHERE p.grantee = $1::regrole`, role)
	require.NoError(t, err)
	recorded := map[grant]bool{}
	var g grant
	_, err = pgx.ForEachRow(rows, []any{&g.object, &g.privilege, &g.column}, func() error {
		recorded[g] = true
		return nil
	})
	require.NoError(t, err)
	require.Empty(t, missing(recorded, sqlGrants), "PostgreSQL recorded these grants from %s, which the test did not read in it", grantsFile)
	require.Empty(t, missing(sqlGrants, recorded), "the test read these grants in %s, which PostgreSQL did not record", grantsFile)
	require.Empty(t, missing(sqlGrants, tableGrants))
}

// missingGrant says, from a log of `run` under the workers' role, which object it
// was refused, and what to grant: the failure a grant missing from deploy/grants.sql
// causes, said where the test fails.
func missingGrant(logs string) string {
	found := map[string]bool{}
	var out []string
	for _, m := range regexp.MustCompile(`permission denied for (\w+) (\w+)`).FindAllStringSubmatch(logs, -1) {
		if what := m[1] + " " + m[2]; !found[what] {
			found[what] = true
			out = append(out, what)
		}
	}
	if len(out) == 0 {
		return ""
	}
	return fmt.Sprintf("; the workers' role was refused on %s: a statement of run (in the log) needs a right %s does not grant: "+
		"SELECT on each column it reads (in WHERE, RETURNING, the right of SET, an upsert's EXCLUDED), UPDATE on each it sets "+
		"(and on one for FOR UPDATE), INSERT on each it inserts; add it there and to docs/security.md's table",
		strings.Join(out, ", "), grantsFile)
}

// issueThroughBinary runs `certworker run` on runDSN against a fresh Pebble, waits
// for /readyz through `certworker healthcheck`, has the proxy (adminDSN) verify a
// domain, and waits for its certificate; then stops the worker with SIGTERM, and
// returns its log.
func issueThroughBinary(t *testing.T, bin, adminDSN, runDSN, wake string, extra ...string) string {
	t.Helper()
	ctx := context.Background()
	http01, admin := workertest.FreeAddr(t), workertest.FreeAddr(t)
	_, port, _ := net.SplitHostPort(http01)
	httpPort, _ := strconv.Atoi(port)
	ca := pebbletest.StartT(t, pebbletest.Options{HTTPPort: httpPort})

	args := append([]string{"run",
		"--database-url", runDSN,
		"--acme-directory", ca.DirectoryURL,
		"--acme-ca-bundle", ca.RootsFile,
		"--acme-profile", pebbletest.DefaultProfile,
		"--http01-listen", http01,
		"--admin-listen", admin,
		"--wake", wake,
		"--preflight", "off", // the test's names resolve only in Pebble's DNS
		"--poll-interval", "2s",
		"--retry-base", "1s",
		"--shutdown-grace", "5s"}, extra...)
	logs, stop := startBinary(t, bin, args...)

	waitFor(t, logs, 30*time.Second, "certworker healthcheck never passed", func() bool {
		code, _, _ := invoke(t, "healthcheck", "--admin-listen", admin, "--timeout", "1s")
		return code == exitOK
	})

	proxy, err := pgx.Connect(ctx, adminDSN)
	require.NoError(t, err)
	defer proxy.Close(ctx)
	name := "granted-" + strings.ToLower(rand.Text()[:10]) + ".example"
	_, err = proxy.Exec(ctx, `
WITH t AS (INSERT INTO proxy_tenants (name, slug, email) VALUES ('shop', $1, 'shop@example.com') RETURNING id)
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token)
SELECT id, $1, 'verified', 'tok' FROM t`, name)
	require.NoError(t, err)

	waitFor(t, logs, 60*time.Second, "the domain never became active", func() bool {
		var status string
		return proxy.QueryRow(ctx, `SELECT ssl_status FROM proxy_domains WHERE domain = $1`, name).Scan(&status) == nil &&
			status == "active"
	})
	var chain string
	require.NoError(t, proxy.QueryRow(ctx, `SELECT certificate_pem FROM proxy_certificates WHERE domain = $1`, name).Scan(&chain))
	leaf, err := issuing.LeafFromPEM(chain)
	require.NoError(t, err)
	require.Equal(t, []string{name}, leaf.DNSNames)
	require.NotContains(t, logs.String(), "permission denied", "%s", missingGrant(logs.String()))

	stop()
	return logs.String()
}

// waitFor waits until done reports true, checking every 100 ms, and fails with what
// and, when run's log holds a "permission denied", the grant that is missing.
func waitFor(t *testing.T, logs *workertest.Buffer, timeout time.Duration, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("%s%s", what, missingGrant(logs.String()))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
