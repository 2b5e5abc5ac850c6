package queue_test

// Benchmarks for the two numbers this service is judged by: how soon after a tenant's
// "verify" the domain is claimed (the reference polled every 30 s), and how many
// claims one instance makes a second. `make bench` runs them with -benchtime 1x: each
// is one long measurement that ignores b.N and reports its own metrics, so ns/op is
// only the run's wall time. Results also go to ../bench/ (the repository's bench/).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/queue"
)

// benchCommand is how the numbers in bench/ were produced, written next to them.
const benchCommand = `CERTWORKER_PG_IMAGE=certworker-postgres:15 go test -run '^$' -bench . -benchtime 1x -timeout 30m ./queue/   (make bench runs the same over ./...)`

// benchDir is the repository's bench/ directory, seen from this package's directory
// (go test runs a package's benchmarks there).
const benchDir = "../bench"

// The wake-latency run. 1,000 verifications give a p99 that rests on ten samples.
const (
	wakeDomains = 1000
	// benchPollInterval is the reference's POLL_INTERVAL, and --poll-interval for the
	// worker under test, so that only NOTIFY can explain a claim inside it.
	benchPollInterval = 30 * time.Second
	// pollSpacing spreads the 1,000 verifications over exactly one poll period, so
	// that their offsets from the poll are uniform, as a tenant's clicks are. Spread
	// over 10 s, they would all land in one third of the period and the result would
	// say where that third was, not how the reference behaves.
	pollSpacing = benchPollInterval / wakeDomains
)

// notifySpacings separate the verifications for the NOTIFY runs: each is a transaction
// of its own and a wake-up of its own, not a burst that one pass drains. 10 ms (100 a
// second) is near what one instance drains on a small, busy machine, so it measures
// latency under load as well; 50 ms leaves it idle between verifications, which is
// the wake latency proper.
var notifySpacings = []time.Duration{10 * time.Millisecond, 50 * time.Millisecond}

// benchDB is one benchmark's database: fresh, migrated, with one tenant.
type benchDB struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	dsn    string
	q      *queue.Queue
	tenant string
}

func newBenchDB(tb testing.TB) *benchDB {
	tb.Helper()
	pool, dsn := pgtest.NewPool(tb)
	d := &benchDB{ctx: context.Background(), pool: pool, dsn: dsn, q: queue.New(pool, queue.DefaultConfig())}
	if err := pool.QueryRow(d.ctx,
		`INSERT INTO proxy_tenants (name, slug, email) VALUES ('bench', 'bench', 'bench@certworker.invalid') RETURNING id::text`,
	).Scan(&d.tenant); err != nil {
		tb.Fatalf("insert tenant: %v", err)
	}
	return d
}

// insertDomains inserts n ACME domains, pending, with the given verification status
// ('verified' puts them straight into the claimable set), and returns their ids in
// insertion order.
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
	// A production table has statistics. Without them (a table filled a moment ago,
	// before autovacuum's first look) the planner takes proxy_domains for empty and
	// joins the renewal statements (MarkRenewals, NextDue) from every active domain
	// instead of from the renewal index: 50 ms a statement at 5,000 active.
	if _, err := d.pool.Exec(d.ctx, `ANALYZE proxy_domains, proxy_certificates`); err != nil {
		tb.Fatalf("analyze: %v", err)
	}
	return ids
}

// roundTrip is the median time of a trivial query from this process to the server:
// the floor under every statement a pass runs.
func (d *benchDB) roundTrip(tb testing.TB) time.Duration {
	tb.Helper()
	var ds []time.Duration
	for range 101 {
		start := time.Now()
		if _, err := d.pool.Exec(d.ctx, `SELECT 1`); err != nil {
			tb.Fatalf("round trip: %v", err)
		}
		ds = append(ds, time.Since(start))
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

func (d *benchDB) countActive(tb testing.TB) int {
	tb.Helper()
	var n int
	if err := d.pool.QueryRow(d.ctx, `SELECT count(*) FROM proxy_domains WHERE ssl_status = 'active'`).Scan(&n); err != nil {
		tb.Fatalf("count active domains: %v", err)
	}
	return n
}

// waitActive waits until n domains are active, reading the count every interval (a
// 10,000-row count, so not too often: it competes with what is being measured).
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

// benchWorker starts this service's worker, with its own pool and listener as in
// cmd/certworker, and stops it when the benchmark ends. Its logs are kept (debug
// included) so that the benchmark can tell when the start-up pass is over and which
// wake-up led to each claim.
func benchWorker(tb testing.TB, dsn string, issuer queue.Issuer, wcfg queue.WorkerConfig) *observer.ObservedLogs {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		tb.Fatalf("worker pool: %v", err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	ctx, cancel := context.WithCancel(context.Background())
	lst := listener.New(pool, log, listener.Options{})
	if err := lst.Start(ctx); err != nil {
		cancel()
		pool.Close()
		tb.Fatalf("start listener: %v", err)
	}
	if wcfg.Owner == "" {
		wcfg.Owner = "bench"
	}
	if wcfg.Directory == "" {
		wcfg.Directory = "https://ca.invalid/directory"
	}
	w := queue.NewWorker(queue.New(pool, queue.DefaultConfig()), issuer, lst.Wakes(), log, wcfg, nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := w.Run(ctx); err != nil {
			tb.Errorf("worker: %v", err)
		}
	}()
	tb.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(time.Minute):
			tb.Error("worker did not stop")
		}
		lst.Stop()
		pool.Close()
	})
	return logs
}

// waitForLog waits until the worker has logged msg at least once.
func waitForLog(tb testing.TB, logs *observer.ObservedLogs, msg string, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for logs.FilterMessage(msg).Len() == 0 {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for the worker to log %q", timeout, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// referenceLoop is the reference worker's run loop (reference/ssl.rs, run and tick),
// over this package's statements: sleep the poll interval, then reclaim, mark
// renewals, and claim, issue and record one domain at a time until nothing is due. No
// listener, no timer, one order at a time. It stops when the benchmark ends.
func referenceLoop(tb testing.TB, q *queue.Queue, issuer queue.Issuer, poll time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	tick := func() error {
		if _, err := q.ReclaimAbandoned(ctx); err != nil {
			return err
		}
		if _, err := q.MarkRenewals(ctx); err != nil {
			return err
		}
		for {
			claims, err := q.Claim(ctx, "reference", 1)
			if err != nil || len(claims) == 0 {
				return err
			}
			c := claims[0]
			cert, err := issuer.Issue(ctx, queue.Request{DomainID: c.ID, Domain: c.Domain, CurrentPEM: c.CurrentPEM})
			if err != nil {
				return fmt.Errorf("issue %s: %w", c.Domain, err)
			}
			if err := q.MarkActive(ctx, c, cert); err != nil {
				return err
			}
		}
	}
	go func() {
		defer close(done)
		t := time.NewTimer(poll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := tick(); err != nil && !errors.Is(err, context.Canceled) {
				tb.Errorf("reference tick: %v", err)
			}
			t.Reset(poll)
		}
	}()
	tb.Cleanup(func() {
		cancel()
		<-done
	})
}

// verifyOneByOne verifies the domains as a tenant would, one UPDATE (one committed
// transaction, one NOTIFY) each, the ith at start + i*spacing.
func (d *benchDB) verifyOneByOne(tb testing.TB, ids []string, start time.Time, spacing time.Duration) {
	tb.Helper()
	for i, id := range ids {
		time.Sleep(time.Until(start.Add(time.Duration(i) * spacing)))
		tag, err := d.pool.Exec(d.ctx, `UPDATE proxy_domains SET verification_status = 'verified' WHERE id = $1`, id)
		if err != nil {
			tb.Fatalf("verify: %v", err)
		}
		if tag.RowsAffected() != 1 {
			tb.Fatalf("verify %s: %d rows", id, tag.RowsAffected())
		}
	}
}

// latency is the wake latency distribution of one run, in milliseconds.
type latency struct {
	mode                string
	n                   int
	p50, p95, p99, max  float64
	min, mean           float64
	spacing, pollPeriod time.Duration
	// load is the host's one-minute load average at the end of the run.
	load string
	note string
}

// wakeLatency reads the distribution from the database, so both ends are on the
// server's clock: ssl_queued_at, which the trigger sets to clock_timestamp() inside
// the verifying UPDATE (a fraction of a millisecond before that transaction commits,
// and its NOTIFY goes out), to ssl_last_attempt_at, which the claim sets to its own
// transaction's now() and which nothing after the claim changes (MarkActive leaves
// it).
func (d *benchDB) wakeLatency(tb testing.TB) latency {
	tb.Helper()
	var l latency
	var p []float64
	if err := d.pool.QueryRow(d.ctx, `
WITH w AS (
    SELECT extract(epoch FROM ssl_last_attempt_at - ssl_queued_at)::float8 * 1000 AS ms
    FROM proxy_domains
    WHERE ssl_status = 'active' AND ssl_queued_at IS NOT NULL AND ssl_last_attempt_at IS NOT NULL)
SELECT count(*), percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY ms),
       max(ms), min(ms), avg(ms)
FROM w`).Scan(&l.n, &p, &l.max, &l.min, &l.mean); err != nil {
		tb.Fatalf("read wake latencies: %v", err)
	}
	l.p50, l.p95, l.p99 = p[0], p[1], p[2]
	return l
}

func (l latency) report(b *testing.B) {
	b.ReportMetric(l.p50, "p50-ms")
	b.ReportMetric(l.p95, "p95-ms")
	b.ReportMetric(l.p99, "p99-ms")
	b.ReportMetric(l.max, "max-ms")
	b.ReportMetric(float64(l.n), "domains")
}

// BenchmarkWakeLatency measures a tenant's "verify" to the claim, for this worker
// (NOTIFY, with a 30 s poll as the safety net only) and for the reference's loop (a
// 30 s poll and nothing else), and writes both to bench/wake-latency.txt.
func BenchmarkWakeLatency(b *testing.B) {
	var results []latency
	for _, spacing := range notifySpacings {
		b.Run("notify/spacing-"+spacing.String(), func(b *testing.B) {
			d := newBenchDB(b)
			ids := d.insertDomains(b, wakeDomains, "pending")
			fake := fakeissuer.New(1)
			logs := benchWorker(b, d.dsn, fake, queue.WorkerConfig{Concurrency: 4, PollInterval: benchPollInterval})
			// The listener's first connection wakes the worker; that pass finds nothing.
			waitForLog(b, logs, "pass finished", 30*time.Second)
			b.ResetTimer()
			d.verifyOneByOne(b, ids, time.Now(), spacing)
			d.waitActive(b, wakeDomains, 2*time.Minute, 50*time.Millisecond)
			b.StopTimer()
			l := d.wakeLatency(b)
			l.mode, l.spacing, l.pollPeriod, l.load = "notify", spacing, benchPollInterval, loadAvg()
			rtt := d.roundTrip(b)
			b.ReportMetric(ms(rtt), "rtt-ms")
			l.note = fmt.Sprintf("%s; %s; %s; SELECT 1 round trip %.3f ms",
				claimSources(logs), notifyBreakdown(b, d, logs), d.windowMaxima(b, 5*time.Second), ms(rtt))
			checkIssuedOnce(b, fake, wakeDomains)
			l.report(b)
			b.Log(l.note)
			results = append(results, l)
		})
	}
	b.Run("poll-only", func(b *testing.B) {
		d := newBenchDB(b)
		ids := d.insertDomains(b, wakeDomains, "pending")
		fake := fakeissuer.New(1)
		b.ResetTimer()
		start := time.Now()
		referenceLoop(b, d.q, fake, benchPollInterval)
		d.verifyOneByOne(b, ids, start, pollSpacing)
		d.waitActive(b, wakeDomains, 3*benchPollInterval, 200*time.Millisecond)
		b.StopTimer()
		l := d.wakeLatency(b)
		l.mode, l.spacing, l.pollPeriod, l.load = "poll-only", pollSpacing, benchPollInterval, loadAvg()
		l.note = "the reference's loop: sleep 30 s, then claim, issue and record one at a time until empty"
		checkIssuedOnce(b, fake, wakeDomains)
		l.report(b)
		results = append(results, l)
	})
	if len(results) > 0 {
		writeWakeLatency(b, results)
	}
}

// claimSources counts the claims by the wake-up that led to them ("order started" logs
// carry it).
func claimSources(logs *observer.ObservedLogs) string {
	counts := map[string]int{}
	for _, e := range logs.FilterMessage("order started").All() {
		counts[fmt.Sprint(e.ContextMap()["source"])]++
	}
	var parts []string
	for _, s := range []string{listener.SourceNotify, listener.SourceReconnect, listener.SourceTimer, listener.SourcePoll} {
		if counts[s] > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", s, counts[s]))
		}
	}
	return "claims by source: " + strings.Join(parts, " ")
}

// notifyBreakdown splits each domain's wake latency at the events the listener and
// the worker log: the listener receiving the notification of the domain's commit, and
// the worker starting the pass that wake-up caused. The server runs in a local
// container and reads the same host clock as this process, so its timestamps and the
// logs' compare. Percentiles (p50/p99) of:
//   - queued -> received: the rest of the verifying transaction, its commit, and
//     delivery of the NOTIFY to the listener's connection;
//   - received -> claimed: everything in this process, up to the claim statement;
//   - pass start -> claimed: of that, the statements a pass runs before it claims
//     (reclaim, renewals, the CA pause), for the domains a notify pass claimed.
func notifyBreakdown(tb testing.TB, d *benchDB, logs *observer.ObservedLogs) string {
	tb.Helper()
	var received []time.Time
	for _, e := range logs.FilterMessage("notification").All() {
		received = append(received, e.Time)
	}
	slices.SortFunc(received, time.Time.Compare)
	type pass struct{ at, started time.Time }
	var passes []pass
	for _, e := range logs.FilterMessage("wake-up").All() {
		if at, ok := e.ContextMap()["at"].(time.Time); ok && e.ContextMap()["source"] == listener.SourceNotify {
			passes = append(passes, pass{at: at, started: e.Time})
		}
	}
	slices.SortFunc(passes, func(a, b pass) int { return a.started.Compare(b.started) })
	rows, err := d.pool.Query(d.ctx, `SELECT ssl_queued_at, ssl_last_attempt_at FROM proxy_domains WHERE ssl_status = 'active'`)
	if err != nil {
		tb.Fatalf("read claim times: %v", err)
	}
	type times struct{ queued, claimed time.Time }
	domains, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (times, error) {
		var t times
		err := r.Scan(&t.queued, &t.claimed)
		return t, err
	})
	if err != nil {
		tb.Fatalf("read claim times: %v", err)
	}
	var deliver, worker, preclaim []float64
	for _, t := range domains {
		if i, _ := slices.BinarySearchFunc(received, t.queued, time.Time.Compare); i < len(received) {
			deliver = append(deliver, ms(received[i].Sub(t.queued)))
			worker = append(worker, ms(t.claimed.Sub(received[i])))
		}
		// The pass that claimed it is the last to start before the claim, if a
		// notification that came after the domain's commit started it.
		i, _ := slices.BinarySearchFunc(passes, t.claimed, func(p pass, c time.Time) int { return p.started.Compare(c) })
		if i > 0 && !passes[i-1].at.Before(t.queued) {
			preclaim = append(preclaim, ms(t.claimed.Sub(passes[i-1].started)))
		}
	}
	q := func(xs []float64) string {
		if len(xs) == 0 {
			return "-"
		}
		slices.Sort(xs)
		at := func(f float64) float64 { return xs[min(int(f*float64(len(xs))), len(xs)-1)] }
		return fmt.Sprintf("%.2f/%.2f ms (n=%d)", at(0.5), at(0.99), len(xs))
	}
	return fmt.Sprintf("p50/p99 of queued->received %s, received->claimed %s, notify pass start->claimed %s",
		q(deliver), q(worker), q(preclaim))
}

// windowMaxima is the worst latency of the domains verified in each window of the
// run, in order: a tail made of one burst (the host busy with something else for a
// few seconds) reads differently from one spread over the whole run.
func (d *benchDB) windowMaxima(tb testing.TB, window time.Duration) string {
	tb.Helper()
	rows, err := d.pool.Query(d.ctx, `
WITH l AS (
    SELECT floor(extract(epoch FROM ssl_queued_at - min(ssl_queued_at) OVER ()) / $1)::int AS w,
           extract(epoch FROM ssl_last_attempt_at - ssl_queued_at)::float8 * 1000 AS ms
    FROM proxy_domains WHERE ssl_status = 'active')
SELECT round(max(ms))::int FROM l GROUP BY w ORDER BY w`, window.Seconds())
	if err != nil {
		tb.Fatalf("read latency windows: %v", err)
	}
	maxima, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		tb.Fatalf("read latency windows: %v", err)
	}
	return fmt.Sprintf("max ms per %s of verifying: %s", window, strings.Trim(fmt.Sprint(maxima), "[]"))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

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

func writeWakeLatency(tb testing.TB, results []latency) {
	tb.Helper()
	var s strings.Builder
	fmt.Fprintf(&s, "# Wake latency: a tenant's verify to the claim of that domain.\n")
	fmt.Fprintf(&s, "# From ssl_queued_at (clock_timestamp() in the trigger, inside the verifying\n")
	fmt.Fprintf(&s, "# transaction, slightly before its commit) to ssl_last_attempt_at (the claiming\n")
	fmt.Fprintf(&s, "# transaction's now()); both on the database's clock. Both ends lean early: now()\n")
	fmt.Fprintf(&s, "# is the claim's transaction start, before the statement is planned and takes its\n")
	fmt.Fprintf(&s, "# snapshot, so on a busy server a claim can even read as a few ms before the verify.\n")
	fmt.Fprintf(&s, "# Domains verified one per transaction, spaced as shown; fake issuer answering at\n")
	fmt.Fprintf(&s, "# once; worker: concurrency 4, --poll-interval 30s; load: 1-min load average after.\n")
	fmt.Fprintf(&s, "# %s\n", benchEnv())
	fmt.Fprintf(&s, "# command: %s\n\n", benchCommand)
	tw := tabwriter.NewWriter(&s, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tn\tp50 ms\tp95 ms\tp99 ms\tmax ms\tmin ms\tmean ms\tspacing\tpoll\tload\t")
	for _, l := range results {
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%s\t%s\t%s\t\n",
			l.mode, l.n, l.p50, l.p95, l.p99, l.max, l.min, l.mean, l.spacing, l.pollPeriod, l.load)
	}
	_ = tw.Flush()
	var poll *latency
	for i := range results {
		if results[i].mode == "poll-only" {
			poll = &results[i]
		}
	}
	s.WriteString("\n")
	for _, l := range results {
		if poll != nil && l.mode != poll.mode {
			fmt.Fprintf(&s, "poll-only / notify (spacing %s): p50 %.0fx, p99 %.0fx\n", l.spacing, poll.p50/l.p50, poll.p99/l.p99)
		}
	}
	s.WriteString("\n")
	for _, l := range results {
		fmt.Fprintf(&s, "%s (spacing %s): %s\n", l.mode, l.spacing, l.note)
	}
	writeBenchFile(tb, "wake-latency.txt", s.String(), false)
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

func writeBenchFile(tb testing.TB, name, text string, appendTo bool) {
	tb.Helper()
	if err := os.MkdirAll(benchDir, 0o755); err != nil {
		tb.Fatalf("results directory: %v", err)
	}
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if appendTo {
		flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	f, err := os.OpenFile(filepath.Join(benchDir, name), flags, 0o644)
	if err != nil {
		tb.Fatalf("results file: %v", err)
	}
	if _, err := f.WriteString(text); err != nil {
		tb.Fatalf("results file: %v", err)
	}
	if err := f.Close(); err != nil {
		tb.Fatalf("results file: %v", err)
	}
}

// appendClaims adds one line to bench/claims.txt, with a header when the file is new.
func appendClaims(tb testing.TB, what string, n int, elapsed time.Duration, perSecond float64, note string) {
	tb.Helper()
	if _, err := os.Stat(filepath.Join(benchDir, "claims.txt")); errors.Is(err, os.ErrNotExist) {
		writeBenchFile(tb, "claims.txt", fmt.Sprintf(
			"# Claim throughput (one line per measurement, appended on every run).\n# command: %s\n"+
				"# %-22s %-28s %7s %9s %10s  %s\n", benchCommand, "when (UTC)", "measurement", "n", "seconds", "per second", "note"), true)
	}
	writeBenchFile(tb, "claims.txt", fmt.Sprintf("%-24s %-28s %7d %9.3f %10.0f  %s\n",
		time.Now().UTC().Format(time.RFC3339), what, n, elapsed.Seconds(), perSecond, note), true)
}

// throughputDomains is the queue the throughput runs drain.
const throughputDomains = 10000

// BenchmarkClaimThroughput drains a queue of 10,000 due domains: through the worker
// (claim, fake issue, MarkActive), and with raw claims in batches, which shows the
// claim statement's own cost. Results are appended to bench/claims.txt.
func BenchmarkClaimThroughput(b *testing.B) {
	for _, conc := range []int{4, 16} {
		b.Run(fmt.Sprintf("worker/concurrency-%d", conc), func(b *testing.B) {
			d := newBenchDB(b)
			d.insertDomains(b, throughputDomains, "verified")
			fake := fakeissuer.New(1)
			// Start and end on the server's clock: from just before the worker starts
			// to the last MarkActive's now(), so the wait below does not count.
			var start time.Time
			if err := d.pool.QueryRow(d.ctx, `SELECT clock_timestamp()`).Scan(&start); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			logs := benchWorker(b, d.dsn, fake, queue.WorkerConfig{Concurrency: conc, PollInterval: benchPollInterval})
			d.waitActive(b, throughputDomains, 5*time.Minute, 100*time.Millisecond)
			b.StopTimer()
			var end time.Time
			if err := d.pool.QueryRow(d.ctx, `SELECT max(updated_at) FROM proxy_domains`).Scan(&end); err != nil {
				b.Fatal(err)
			}
			checkIssuedOnce(b, fake, throughputDomains)
			elapsed := end.Sub(start)
			rate := throughputDomains / elapsed.Seconds()
			b.ReportMetric(rate, "claims/s")
			b.ReportMetric(elapsed.Seconds(), "s-to-all-active")
			note := fmt.Sprintf("worker start to all active; fake issuer, no delay; %s; load %s", claimSources(logs), loadAvg())
			appendClaims(b, fmt.Sprintf("worker concurrency=%d", conc), throughputDomains, elapsed, rate, note)
		})
	}
	for _, batch := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("raw-claim/batch-%d", batch), func(b *testing.B) {
			d := newBenchDB(b)
			d.insertDomains(b, throughputDomains, "verified")
			b.ResetTimer()
			start := time.Now()
			claimed := 0
			for {
				claims, err := d.q.Claim(d.ctx, "bench", batch)
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
			rate := float64(claimed) / elapsed.Seconds()
			b.ReportMetric(rate, "claims/s")
			b.ReportMetric(float64(elapsed.Microseconds())/float64((claimed+batch-1)/batch), "µs/statement")
			appendClaims(b, fmt.Sprintf("raw q.Claim limit=%d", batch), claimed, elapsed, rate,
				"one goroutine, claims only (no issue, no MarkActive); load "+loadAvg())
		})
	}
}

// BenchmarkClaimPlan100k runs the claim under EXPLAIN ANALYZE at 100,000 domains, 99%
// active and 1% due, the shape of a mature installation, and reports the server's
// execution time. Each run is rolled back, so every one claims from the same queue.
func BenchmarkClaimPlan100k(b *testing.B) {
	d := newBenchDB(b)
	if _, err := d.pool.Exec(d.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
SELECT $1, 'bulk' || g || '.example', 'verified', 'tok',
       CASE WHEN g % 100 = 0 THEN 'pending' ELSE 'active' END, 'acme'
FROM generate_series(1, 100000) g`, d.tenant); err != nil {
		b.Fatal(err)
	}
	if _, err := d.pool.Exec(d.ctx, `VACUUM ANALYZE proxy_domains`); err != nil {
		b.Fatal(err)
	}
	cfg := queue.DefaultConfig()
	explain := func(limit int) (plan string, execMS, planMS float64) {
		tx, err := d.pool.Begin(d.ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer tx.Rollback(d.ctx) //nolint:errcheck
		rows, err := tx.Query(d.ctx, `EXPLAIN (ANALYZE, BUFFERS) `+queue.ClaimSQLForTest,
			cfg.MaxAttempts, cfg.RetryBase.Seconds(), cfg.RetryMax.Seconds(), "explain", cfg.Lease.Seconds(), limit)
		if err != nil {
			b.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			b.Fatal(err)
		}
		plan = strings.Join(lines, "\n")
		return plan, planTime(b, plan, "Execution Time"), planTime(b, plan, "Planning Time")
	}
	b.ResetTimer()
	for _, limit := range []int{1, 4, 16} {
		var execs, plans []float64
		var plan string
		for range 7 {
			p, e, pl := explain(limit)
			plan, execs, plans = p, append(execs, e), append(plans, pl)
		}
		slices.Sort(execs)
		slices.Sort(plans)
		med, medPlan := execs[len(execs)/2], plans[len(plans)/2]
		b.ReportMetric(med, fmt.Sprintf("exec-ms/limit-%d", limit))
		if !strings.Contains(plan, "proxy_domains_queue_idx") {
			b.Errorf("the claim does not use its index:\n%s", plan)
		}
		if limit == 4 {
			b.Logf("plan (limit 4, last of 7 runs):\n%s", plan)
		}
		appendClaims(b, fmt.Sprintf("EXPLAIN ANALYZE limit=%d", limit), 100000, time.Duration(med*float64(time.Millisecond)), 0,
			fmt.Sprintf("claim at 100k domains, 1%% due: median of 7 execution %.3f ms, planning %.3f ms (per-second column unused)", med, medPlan))
	}
}

// planTime reads "<label>: 1.234 ms" from EXPLAIN ANALYZE's text output.
func planTime(tb testing.TB, plan, label string) float64 {
	tb.Helper()
	m := regexp.MustCompile(regexp.QuoteMeta(label) + `: ([0-9.]+) ms`).FindStringSubmatch(plan)
	if m == nil {
		tb.Fatalf("no %s in the plan:\n%s", label, plan)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		tb.Fatal(err)
	}
	return v
}
