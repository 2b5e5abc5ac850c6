package worker_test

// Benchmarks for the two numbers this service is judged by: how soon after a
// tenant's "verify" the domain is claimed, and how many domains one instance drains a
// second. `make bench` runs them with -benchtime 1x: each is one long measurement that
// ignores b.N and reports its own metrics, so ns/op is only the run's wall time. Each
// writes its table to the repository's bench/, replacing the previous run's: one file
// per machine and load, not a growing log.

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// benchCommand is how the numbers in bench/ were produced, written next to them.
const benchCommand = `make bench (CERTWORKER_PG_IMAGE=certworker-postgres:15 go test -run '^$' -bench . -benchtime 1x ./queue/worker/)`

// benchDir is the repository's bench/ directory, seen from this package's directory.
const benchDir = "../../bench"

// benchDB is one benchmark's database: fresh, migrated, with one tenant.
type benchDB struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	dsn    string
	tenant string
}

func newBenchDB(tb testing.TB) *benchDB {
	tb.Helper()
	pool, dsn := pgtest.NewPool(tb)
	return &benchDB{ctx: context.Background(), pool: pool, dsn: dsn, tenant: pgtest.Tenant(tb, pool)}
}

// insertDomains inserts n ACME domains, pending, with the given verification status
// ('verified' puts them straight into the claimable set), and returns their ids.
func (d *benchDB) insertDomains(tb testing.TB, n int, verification string) []string {
	tb.Helper()
	rows, err := d.pool.Query(d.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
SELECT $1, 'bench' || g || '.example', $3, 'tok', 'pending', 'acme' FROM generate_series(1, $2::int) g
RETURNING id::text`, d.tenant, n, verification)
	if err != nil {
		tb.Fatalf("insert domains: %v", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		tb.Fatalf("insert domains: %v", err)
	}
	// A production table has statistics; one filled a moment ago has none until
	// autovacuum's first look, and the planner takes it for empty.
	if _, err := d.pool.Exec(d.ctx, `VACUUM ANALYZE proxy_domains, proxy_certificates`); err != nil {
		tb.Fatalf("analyze: %v", err)
	}
	return ids
}

func (d *benchDB) countActive(tb testing.TB) int {
	tb.Helper()
	var n int
	if err := d.pool.QueryRow(d.ctx, `SELECT count(*) FROM proxy_domains WHERE ssl_status = 'active'`).Scan(&n); err != nil {
		tb.Fatalf("count active domains: %v", err)
	}
	return n
}

// waitActive waits until n domains are active, reading the count every interval (not
// too often: the count competes with what is being measured).
func (d *benchDB) waitActive(tb testing.TB, n int, timeout, interval time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := d.countActive(tb)
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s: %d of %d domains active", timeout, got, n)
		}
		time.Sleep(interval)
	}
}

// benchWorker starts a worker as `certworker run` builds it, logging as production
// does (JSON at info level; to io.Discard here), so the benchmark pays for its logs.
func benchWorker(tb testing.TB, dsn string, issuer issuing.Issuer, cfg worker.Config) *workertest.Instance {
	tb.Helper()
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	cfg.Log = zap.New(zapcore.NewCore(enc, zapcore.AddSync(io.Discard), zapcore.InfoLevel))
	cfg.Issuer = issuer
	return workertest.Start(tb, dsn, "bench", cfg)
}

// claimSources counts the claims by the source of the pass that made them.
func claimSources(tb testing.TB, in *workertest.Instance) string {
	var parts []string
	for _, s := range []string{listener.SourceNotify, listener.SourceReconnect, listener.SourceRefill,
		listener.SourceTimer, listener.SourcePoll} {
		if n := in.Metric(tb, "certworker_claims_total", s); n > 0 {
			parts = append(parts, fmt.Sprintf("%s=%.0f", s, n))
		}
	}
	return "claims by source: " + strings.Join(parts, " ")
}

// checkIssuedOnce fails the benchmark unless every domain was ordered exactly once: a
// fast wrong answer is not a result.
func checkIssuedOnce(tb testing.TB, fake *fakeissuer.Issuer, n int) {
	tb.Helper()
	counts := fake.Counts()
	if len(counts) != n {
		tb.Fatalf("%d domains ordered, want %d", len(counts), n)
	}
	for dom, c := range counts {
		if c != 1 {
			tb.Fatalf("%s ordered %d times", dom, c)
		}
	}
}

// throughputDomains is the queue the throughput runs drain.
const throughputDomains = 10000

// drainResult is one throughput run.
type drainResult struct {
	what    string
	elapsed time.Duration
	rate    float64
	note    string
}

// BenchmarkClaimThroughput drains a queue of 10,000 due domains through the worker
// (claim, fake issue, store) at --concurrency 4 and 16, and with bare claims, one row
// and 16 rows a statement, which is the claim statement's own cost: all in one run,
// so that the ratios compare like with like. It profiles the worker at 16 (pprof, and
// pg_stat_statements on the server) and writes bench/claims.txt.
func BenchmarkClaimThroughput(b *testing.B) {
	var results []drainResult
	var profileTop, statementsTop string
	for _, run := range []struct {
		conc      int
		noHandoff bool // the certificate trigger's NOTIFY off, to show what it costs
	}{{4, false}, {16, false}, {16, true}} {
		conc := run.conc
		name := fmt.Sprintf("worker/concurrency-%d", conc)
		if run.noHandoff {
			name += "/no-handoff-notify"
		}
		b.Run(name, func(b *testing.B) {
			d := newBenchDB(b)
			d.insertDomains(b, throughputDomains, "verified")
			if run.noHandoff {
				if _, err := d.pool.Exec(d.ctx, `ALTER TABLE proxy_certificates
    DISABLE TRIGGER certworker_certificate_insert, DISABLE TRIGGER certworker_certificate_update`); err != nil {
					b.Fatal(err)
				}
			}
			resetStatements(b, d)
			fake := fakeissuer.New(1)
			var prof strings.Builder
			if conc == 16 && !run.noHandoff {
				stop := startCPUProfile(b, &prof)
				defer func() { profileTop = stop() }()
			}
			// From just before the worker starts to the last store, on the server's
			// clock, so the wait below does not count.
			var start time.Time
			if err := d.pool.QueryRow(d.ctx, `SELECT clock_timestamp()`).Scan(&start); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			in := benchWorker(b, d.dsn, fake, worker.Config{Concurrency: conc, PollInterval: 30 * time.Second})
			d.waitActive(b, throughputDomains, 5*time.Minute, 50*time.Millisecond)
			b.StopTimer()
			var end time.Time
			if err := d.pool.QueryRow(d.ctx, `SELECT max(updated_at) FROM proxy_domains`).Scan(&end); err != nil {
				b.Fatal(err)
			}
			checkIssuedOnce(b, fake, throughputDomains)
			r := drainResult{what: fmt.Sprintf("worker, --concurrency %d", conc), elapsed: end.Sub(start)}
			if run.noHandoff {
				r.what += ", hand-off NOTIFY off"
			}
			r.rate = throughputDomains / r.elapsed.Seconds()
			r.note = fmt.Sprintf("worker start to all active; fake issuer answering at once; %s", claimSources(b, in))
			b.ReportMetric(r.rate, "claims/s")
			results = append(results, r)
			if conc == 16 && !run.noHandoff {
				statementsTop = topStatements(b, d)
			}
		})
	}
	for _, batch := range []int{1, 16} {
		b.Run(fmt.Sprintf("bare-claim/batch-%d", batch), func(b *testing.B) {
			d := newBenchDB(b)
			d.insertDomains(b, throughputDomains, "verified")
			q := queue.New(d.pool, issuing.DefaultConfig())
			b.ResetTimer()
			start := time.Now()
			claimed := 0
			for {
				claims, err := q.Claim(d.ctx, "bench", workertest.Directory, batch)
				if err != nil {
					b.Fatal(err)
				}
				if len(claims) == 0 {
					break
				}
				claimed += len(claims)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			if claimed != throughputDomains {
				b.Fatalf("claimed %d, want %d", claimed, throughputDomains)
			}
			r := drainResult{what: fmt.Sprintf("bare claim, %d a statement", batch), elapsed: elapsed,
				rate: float64(claimed) / elapsed.Seconds(), note: "one goroutine, claims only (no issue, no store)"}
			b.ReportMetric(r.rate, "claims/s")
			results = append(results, r)
		})
	}
	if len(results) == 5 {
		writeClaims(b, results, profileTop, statementsTop)
	}
}

func writeClaims(tb testing.TB, results []drainResult, profileTop, statementsTop string) {
	var s strings.Builder
	fmt.Fprintf(&s, "# Draining 10,000 due domains: the worker (claim, fake issue, store) and the bare claim.\n")
	fmt.Fprintf(&s, "# One run; every line measured in it. The worker's time runs on the database's clock from\n")
	fmt.Fprintf(&s, "# just before it starts to the last store; its logs are production JSON at info level.\n")
	fmt.Fprintf(&s, "# %s\n# command: %s\n\n", benchEnv(), benchCommand)
	tw := tabwriter.NewWriter(&s, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "measurement\tseconds\tper second\tnote")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%.2f\t%.0f\t%s\n", r.what, r.elapsed.Seconds(), r.rate, r.note)
	}
	_ = tw.Flush()
	w16, quiet16, bare1, bare16 := results[1].rate, results[2].rate, results[3].rate, results[4].rate
	fmt.Fprintf(&s, "\nworker at 16 / bare claim one at a time: %.2f; / bare claim 16 at a time: %.2f\n", w16/bare1, w16/bare16)
	fmt.Fprintf(&s, "worker at 16 with the certificate hand-off's NOTIFY / without it: %.2f\n", w16/quiet16)
	fmt.Fprintf(&s, "\nWhere the worker's time went at --concurrency 16 (this process, pprof, top by cumulative CPU):\n%s", profileTop)
	fmt.Fprintf(&s, "\nWhere the server's time went (pg_stat_statements, top by total time):\n%s", statementsTop)
	writeBenchFile(tb, "claims.txt", s.String())
}

// startCPUProfile profiles this process until the returned function is called, which
// returns the profile's top lines by cumulative time.
func startCPUProfile(tb testing.TB, buf *strings.Builder) func() string {
	tb.Helper()
	f, err := os.CreateTemp("", "certworker-cpu-*.pprof")
	if err != nil {
		tb.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		tb.Fatal(err)
	}
	return func() string {
		pprof.StopCPUProfile()
		defer os.Remove(f.Name())
		_ = f.Close()
		return profileTopLines(tb, f.Name(), 18)
	}
}

// profileTopLines is `go tool pprof -top -cum` of a CPU profile, its first n
// functions of this module and the libraries it calls (the runtime's are left out).
func profileTopLines(tb testing.TB, path string, n int) string {
	tb.Helper()
	out, err := exec.Command("go", "tool", "pprof", "-top", "-cum", path).Output()
	if err != nil {
		return "  (go tool pprof: " + err.Error() + ")\n"
	}
	var s strings.Builder
	kept := 0
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		switch {
		case len(f) > 0 && (f[0] == "Duration:" || f[0] == "flat"):
			s.WriteString("  " + line)
		case len(f) == 6 && !strings.HasPrefix(f[5], "runtime.") && !strings.HasPrefix(f[5], "testing.") && kept < n:
			s.WriteString("  " + line)
			kept++
		}
	}
	return s.String()
}

// resetStatements clears pg_stat_statements, where the server has it.
func resetStatements(tb testing.TB, d *benchDB) {
	tb.Helper()
	if _, err := d.pool.Exec(d.ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return
	}
	_, _ = d.pool.Exec(d.ctx, `SELECT pg_stat_statements_reset()`)
}

// topStatements is the server's statements of this database by total time, where
// pg_stat_statements is loaded (the package's server is started with it).
func topStatements(tb testing.TB, d *benchDB) string {
	tb.Helper()
	rows, err := d.pool.Query(d.ctx, `
SELECT calls, round(total_exec_time::numeric, 1), round(mean_exec_time::numeric, 3),
       regexp_replace(left(query, 90), '\s+', ' ', 'g')
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY total_exec_time DESC LIMIT 8`)
	if err != nil {
		return "  (pg_stat_statements is not loaded: " + err.Error() + ")\n"
	}
	defer rows.Close()
	var s strings.Builder
	fmt.Fprintf(&s, "  %8s %10s %9s  %s\n", "calls", "total ms", "mean ms", "statement")
	for rows.Next() {
		var calls int64
		var total, mean float64
		var q string
		if err := rows.Scan(&calls, &total, &mean, &q); err != nil {
			tb.Fatal(err)
		}
		fmt.Fprintf(&s, "  %8d %10.1f %9.3f  %s\n", calls, total, mean, q)
	}
	return s.String()
}

// benchEnv describes the machine, for the results files.
func benchEnv() string {
	return fmt.Sprintf("%s, %s %s/%s, %d CPUs, load average %s, PostgreSQL image %s (local container, fsync=off)",
		time.Now().UTC().Format(time.RFC3339), runtime.Version(), runtime.GOOS, runtime.GOARCH,
		runtime.NumCPU(), loadAvg(), pgtest.Image())
}

// loadAvg is the host's one-minute load average, or "?" off Linux. The numbers here
// are only as good as the machine was quiet: a shared host is noted, not hidden.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

func writeBenchFile(tb testing.TB, name, text string) {
	tb.Helper()
	if err := os.MkdirAll(benchDir, 0o755); err != nil {
		tb.Fatalf("results directory: %v", err)
	}
	if err := os.WriteFile(filepath.Join(benchDir, name), []byte(text), 0o644); err != nil {
		tb.Fatalf("results file: %v", err)
	}
}
