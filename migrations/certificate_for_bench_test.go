package migrations_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
)

// fillServingMillion builds 1,000,000 domains of 10,000 tenants, 100 each: per tenant
// t<n>.example, a verified wildcard *.t<n>.example with a certificate, 89 verified
// names with one (d1 to d89), 5 verified names waiting for theirs (d90 to d94) and 5
// unverified ones (d95 to d99); the d1 of every fifth tenant has a case twin (D1,
// another verified acme row without a certificate). The certificates of the names asked for
// are the size of a real chain and sealed key; the others are a few bytes, so the
// database fits the machine (the look-up reads their index entries and heap rows,
// not their text, which is stored apart).
func fillServingMillion(tb testing.TB, conn *pgx.Conn) {
	tb.Helper()
	ctx := context.Background()
	for _, sql := range []string{
		`INSERT INTO proxy_tenants (name, slug, email) SELECT 't' || g, 't' || g, 't@x' FROM generate_series(1, 10000) g`,
		`INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
         SELECT t.id, CASE WHEN k = 0 THEN '*.' ELSE 'd' || k || '.' END || t.slug || '.example',
                CASE WHEN k >= 95 THEN 'pending' ELSE 'verified' END, 'tok',
                CASE WHEN k BETWEEN 90 AND 94 THEN 'pending' ELSE 'active' END, 'acme'
         FROM proxy_tenants t, generate_series(0, 99) k`,
		`INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
         SELECT t.id, 'D1.' || t.slug || '.example', 'verified', 'tok', 'pending', 'acme'
         FROM proxy_tenants t WHERE t.slug IN (SELECT 't' || g FROM generate_series(1, 10000, 5) g)`,
		`INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at)
         SELECT domain, 'pem', 'key', now() + interval '60 days' FROM proxy_domains
         WHERE ssl_status = 'active' AND verification_status = 'verified'`,
		// The names asked for (of tenants 1, 6, 11...): a chain of two certificates
		// (3,008 characters of PEM) and a sealed P-256 key (320), of hexadecimal
		// digits drawn at random, which do not compress.
		`UPDATE proxy_certificates SET
             certificate_pem = (SELECT string_agg(md5(domain || g || random()), '') FROM generate_series(1, 94) g),
             private_key_pem = 'certworker:aes256gcm:v2:00000000:' || (SELECT string_agg(md5(domain || g || random()), '') FROM generate_series(1, 9) g)
         WHERE domain ~ '^(d(1|2|50)|\*)\.t[0-9]*[16]\.example$'`,
		`VACUUM ANALYZE proxy_tenants, proxy_domains, proxy_certificates`,
	} {
		_, err := conn.Exec(ctx, sql)
		require.NoError(tb, err, sql)
	}
}

// servingMillionDB is a connection to a new database that fillServingMillion filled.
func servingMillionDB(b *testing.B) *pgx.Conn {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.NewDB(b))
	require.NoError(b, err)
	b.Cleanup(func() { conn.Close(ctx) })
	start := time.Now()
	fillServingMillion(b, conn)
	b.Logf("filled in %s", time.Since(start).Round(time.Second))
	return conn
}

// BenchmarkCertificateForAtAMillion measures certworker_certificate_for at a million
// domains, as a proxy calls it (a prepared statement, its generic plan): the
// server's execution time of each call (EXPLAIN ANALYZE's, without per-node timing)
// and the call's round trip from this client over loopback, median and p99 of 2,000
// names of each kind. It writes bench/certificate-for.txt.
func BenchmarkCertificateForAtAMillion(b *testing.B) {
	ctx := context.Background()
	conn := servingMillionDB(b)
	var domains int
	require.NoError(b, conn.QueryRow(ctx, `SELECT count(*) FROM proxy_domains`).Scan(&domains))
	require.Equal(b, 1_002_000, domains)

	const servedSQL = `SELECT domain, certificate_pem, private_key_pem, expires_at, version FROM certworker_certificate_for($1)`
	_, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan; PREPARE served(text) AS `+servedSQL)
	require.NoError(b, err)
	// Tenants t1, t6, t11...: each kind's 2,000 names are of different tenants.
	kinds := []struct {
		what   string
		name   func(tenant int) string
		domain func(tenant int) string // the row served; "" for none
	}{
		{"a name's own certificate", func(n int) string { return fmt.Sprintf("d50.t%d.example", n) },
			func(n int) string { return fmt.Sprintf("d50.t%d.example", n) }},
		{"the same, in upper case with a trailing dot", func(n int) string { return fmt.Sprintf("D2.T%d.Example.", n) },
			func(n int) string { return fmt.Sprintf("d2.t%d.example", n) }},
		{"a case twin's (two verified acme rows)", func(n int) string { return fmt.Sprintf("d1.t%d.example", n) },
			func(n int) string { return fmt.Sprintf("d1.t%d.example", n) }},
		{"a wildcard's, for a name with no row", func(n int) string { return fmt.Sprintf("www.t%d.example", n) },
			func(n int) string { return fmt.Sprintf("*.t%d.example", n) }},
		{"a wildcard's, for an unverified row", func(n int) string { return fmt.Sprintf("d97.t%d.example", n) },
			func(n int) string { return fmt.Sprintf("*.t%d.example", n) }},
		{"none: a verified row without a certificate", func(n int) string { return fmt.Sprintf("d90.t%d.example", n) },
			func(int) string { return "" }},
		{"none: no row, no wildcard", func(n int) string { return fmt.Sprintf("a.b.t%d.example", n) },
			func(int) string { return "" }},
	}
	results := measureKinds(b, len(kinds), func(kind, tenant int) (time.Duration, time.Duration) {
		k := kinds[kind]
		name := k.name(tenant)
		exec, actualRows := explainExecute(b, conn, `served('`+name+`')`)
		t0 := time.Now()
		rows, err := conn.Query(ctx, servedSQL, name) // prepared once by pgx, as a proxy's driver does
		require.NoError(b, err)
		got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
			vals, err := row.Values()
			if err != nil {
				return "", err
			}
			return vals[0].(string), nil
		})
		trip := time.Since(t0)
		require.NoError(b, err)
		want := k.domain(tenant)
		if want == "" {
			require.Empty(b, got, name)
			require.Zero(b, actualRows, name)
		} else {
			require.Equal(b, []string{want}, got, name)
		}
		return exec, trip
	})
	for i := range results {
		results[i].what = kinds[i].what
	}

	writeBenchTable(b, "certificate-for.txt", fmt.Sprintf(`# certworker_certificate_for at a million domains (migrations/certificate_for_bench_test.go):
# 1,002,000 domains of 10,000 tenants (a wildcard each, 89 names with a certificate, 5
# verified waiting for one, 5 unverified; 2,000 case twins), %s names of each kind, each
# of another tenant, asked once each on one session in the generic plan
# (force_generic_plan). "exec" is the server's Execution Time of EXPLAIN (ANALYZE,
# TIMING OFF) EXECUTE of the prepared statement; "round trip" is this client's time for
# the statement a proxy sends (prepared once by pgx), over loopback, rows read (the
# certificate and key of a served name are the size of a real chain and sealed key).
`, "2,000"), "BenchmarkCertificateForAtAMillion", results)
}

// measureKinds calls call for each of kinds kinds, for tenants 1, 6, 11, ... (2,000 of
// them: each kind's calls are of different tenants), once per b.Loop, and returns a
// row per kind of the server's execution times and the round trips call measured.
func measureKinds(b *testing.B, kinds int, call func(kind, tenant int) (exec, trip time.Duration)) []benchRow {
	const each = 2000 // the headers say "2,000"
	var results []benchRow
	for b.Loop() {
		results = make([]benchRow, kinds)
		for k := range kinds {
			for i := range each {
				exec, trip := call(k, 1+5*i)
				results[k].exec = append(results[k].exec, exec)
				results[k].trip = append(results[k].trip, trip)
			}
		}
	}
	return results
}

// benchRow is one kind of call: the server's execution times and the client's round
// trips, one per call.
type benchRow struct {
	what       string
	exec, trip []time.Duration
}

// explainExecute runs EXPLAIN (ANALYZE, TIMING OFF) EXECUTE of call (a prepared
// statement and its arguments, written out) and returns the server's execution time
// and the rows the plan's top node returned.
func explainExecute(b *testing.B, conn *pgx.Conn, call string) (time.Duration, float64) {
	b.Helper()
	var plan string
	require.NoError(b, conn.QueryRow(context.Background(), `EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) EXECUTE `+call,
		pgx.QueryExecModeSimpleProtocol).Scan(&plan))
	var explained []struct {
		Plan struct {
			ActualRows float64 `json:"Actual Rows"`
		} `json:"Plan"`
		ExecutionTime float64 `json:"Execution Time"`
	}
	require.NoError(b, json.Unmarshal([]byte(plan), &explained))
	require.Len(b, explained, 1)
	return time.Duration(explained[0].ExecutionTime * float64(time.Millisecond)), explained[0].Plan.ActualRows
}

// writeBenchTable writes bench/FILE: header (what was measured, how), a line naming
// the machine, the command that makes the file again (benchmark NAME), and a row of
// medians and p99s for each kind of call.
func writeBenchTable(b *testing.B, file, header, name string, rows []benchRow) {
	pct := func(d []time.Duration, p int) string {
		s := slices.Clone(d)
		slices.Sort(s)
		return fmt.Sprintf("%.3f ms", float64(s[(len(s)-1)*p/100])/float64(time.Millisecond))
	}
	var text strings.Builder
	text.WriteString(header)
	fmt.Fprintf(&text, `# %s, %s %s/%s, %d CPUs, load average %s when written, PostgreSQL image %s
# command: CERTWORKER_PG_IMAGE=%s go test -run '^$' -bench %s -benchtime 1x ./migrations/

%-46s %12s %12s %14s %14s
`, time.Now().UTC().Format("2006-01-02T15:04Z"), runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), loadAverage(), pgtest.Image(), pgtest.Image(),
		name, "kind of name", "exec p50", "exec p99", "round trip p50", "round trip p99")
	for _, r := range rows {
		fmt.Fprintf(&text, "%-46s %12s %12s %14s %14s\n", r.what, pct(r.exec, 50), pct(r.exec, 99), pct(r.trip, 50), pct(r.trip, 99))
	}
	b.Log("\n" + text.String())
	require.NoError(b, os.WriteFile(filepath.Join("..", "bench", file), []byte(text.String()), 0o644))
}

// loadAverage is the machine's one-minute load average, "?" where it cannot be read.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}
