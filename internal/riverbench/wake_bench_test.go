package riverbench_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue/worker"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	// wakeItems is how many verifications (jobs) a run makes, one transaction each.
	wakeItems = 1000
	// concurrency is certworker's --concurrency and River's MaxWorkers.
	concurrency = 4
	// pollInterval is certworker's --poll-interval: only NOTIFY explains a claim
	// inside it.
	pollInterval = 30 * time.Second
	benchFile    = "../../bench/wake-river.txt"
	benchCommand = "cd internal/riverbench && CERTWORKER_PG_IMAGE=certworker-postgres:15 go test -run '^$' -bench BenchmarkWakeLatencyAgainstRiver -benchtime 1x -timeout 30m ."
)

// spacings are the wake-latency benchmark's (queue/worker/wake_bench_test.go).
var spacings = []time.Duration{50 * time.Millisecond, 10 * time.Millisecond}

type wakeArgs struct {
	N int `json:"n"`
}

func (wakeArgs) Kind() string { return "wake" }

type wakeWorker struct {
	river.WorkerDefaults[wakeArgs]
}

func (*wakeWorker) Work(context.Context, *river.Job[wakeArgs]) error { return nil }

// dist is a latency distribution in milliseconds.
type dist struct {
	n                  int
	p50, p95, p99, max float64
}

// readDist reads the distribution of the query's single column (milliseconds).
func readDist(tb testing.TB, pool *pgxpool.Pool, q string) dist {
	tb.Helper()
	var d dist
	var p []float64
	require.NoError(tb, pool.QueryRow(context.Background(), `
WITH w AS (`+q+`)
SELECT count(*), percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY ms), max(ms) FROM w`).Scan(&d.n, &p, &d.max))
	d.p50, d.p95, d.p99 = p[0], p[1], p[2]
	return d
}

// paced runs f(i) for i in [0, n), the ith at start + i*spacing.
func paced(tb testing.TB, n int, spacing time.Duration, f func(i int) error) {
	tb.Helper()
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * spacing)))
		require.NoError(tb, f(i))
	}
}

// waitFor polls cond every 50 ms until it holds, or fails after timeout.
func waitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(50 * time.Millisecond) {
		require.True(tb, time.Now().Before(deadline), "timed out waiting for %s", what)
	}
}

// certworkerRun is the wake-latency benchmark's notify run: domains verified one per
// transaction, from ssl_queued_at (clock_timestamp() in the trigger) to
// ssl_last_attempt_at (the claim's now()), on the database's clock.
func certworkerRun(b *testing.B, spacing time.Duration) dist {
	pool, dsn := pgtest.NewPool(b)
	ctx := context.Background()
	tenant := pgtest.Tenant(b, pool)
	rows, err := pool.Query(ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
SELECT $1, 'bench' || g || '.example', 'pending', 'tok', 'pending', 'acme' FROM generate_series(1, $2::int) g
RETURNING id::text`, tenant, wakeItems)
	require.NoError(b, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(b, err)
	in := workertest.Start(b, dsn, "bench", worker.Config{Issuer: fakeissuer.New(1), Concurrency: concurrency, PollInterval: pollInterval})
	in.WaitForLog(b, "pass finished", 1, 30*time.Second)
	paced(b, wakeItems, spacing, func(i int) error {
		_, err := pool.Exec(ctx, `UPDATE proxy_domains SET verification_status = 'verified' WHERE id = $1`, ids[i])
		return err
	})
	waitFor(b, 2*time.Minute, "every domain active", func() bool {
		var n int
		require.NoError(b, pool.QueryRow(ctx, `SELECT count(*) FROM proxy_domains WHERE ssl_status = 'active'`).Scan(&n))
		return n == wakeItems
	})
	return readDist(b, pool, `SELECT extract(epoch FROM ssl_last_attempt_at - ssl_queued_at)::float8 * 1000 AS ms
    FROM proxy_domains WHERE ssl_status = 'active'`)
}

// riverRun inserts jobs one per transaction (Client.Insert), and measures from the
// job's created_at (the inserting transaction's now()) to its attempted_at (the
// fetching statement's now(), just before the worker starts), on the database's
// clock. cooldown is River's FetchCooldown (0: its default, 100 ms), which also
// spaces the notifications its inserts send.
func riverRun(b *testing.B, spacing, cooldown time.Duration) dist {
	pool, _ := pgtest.NewPool(b)
	ctx := context.Background()
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	require.NoError(b, err)
	_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	require.NoError(b, err)
	workers := river.NewWorkers()
	river.AddWorker(workers, &wakeWorker{})
	client, err := river.NewClient(driver, &river.Config{
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: concurrency}},
		Workers:       workers,
		FetchCooldown: cooldown,
		Logger:        slog.New(slog.DiscardHandler),
	})
	require.NoError(b, err)
	require.NoError(b, client.Start(ctx))
	b.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = client.Stop(sctx)
	})
	paced(b, wakeItems, spacing, func(i int) error {
		_, err := client.Insert(ctx, wakeArgs{N: i}, nil)
		return err
	})
	waitFor(b, 2*time.Minute, "every job completed", func() bool {
		var n int
		require.NoError(b, pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE state = 'completed'`).Scan(&n))
		return n == wakeItems
	})
	return readDist(b, pool, `SELECT extract(epoch FROM attempted_at - created_at)::float8 * 1000 AS ms
    FROM river_job WHERE state = 'completed'`)
}

type result struct {
	who     string
	spacing time.Duration
	d       dist
	load    string
}

// BenchmarkWakeLatencyAgainstRiver: at each spacing of the wake-latency benchmark,
// 1,000 verifications to certworker's claim, and 1,000 River jobs to their fetch,
// with River's defaults and with its fetch cooldown at its minimum (1 ms), each on a
// fresh database of the same server, one after another. Results go to
// bench/wake-river.txt with the certworker/River ratios of p50 and p99.
func BenchmarkWakeLatencyAgainstRiver(b *testing.B) {
	var results []result
	for _, spacing := range spacings {
		for _, peer := range []struct {
			name, who string
			run       func(*testing.B) dist
		}{
			{"certworker", "certworker", func(b *testing.B) dist { return certworkerRun(b, spacing) }},
			{"river", "River (defaults)", func(b *testing.B) dist { return riverRun(b, spacing, 0) }},
			{"river-cooldown-1ms", "River (FetchCooldown 1ms)", func(b *testing.B) dist { return riverRun(b, spacing, time.Millisecond) }},
		} {
			b.Run(fmt.Sprintf("%s/spacing-%s", peer.name, spacing), func(b *testing.B) {
				var d dist
				for range b.N {
					d = peer.run(b)
				}
				b.ReportMetric(d.p50, "p50-ms")
				b.ReportMetric(d.p99, "p99-ms")
				results = append(results, result{who: peer.who, spacing: spacing, d: d, load: loadAvg()})
			})
		}
	}
	if len(results) == 3*len(spacings) {
		writeTable(b, results)
	}
}

func writeTable(b *testing.B, results []result) {
	var sb strings.Builder
	sb.WriteString("# Wake latency beside River: certworker's verify -> claim, and a River job's insert -> fetch.\n")
	sb.WriteString("# certworker: from ssl_queued_at (clock_timestamp() in the wake trigger) to ssl_last_attempt_at (the\n")
	sb.WriteString("# claim's now()); River v0.51.2 (riverpgxv5): from created_at (the insert's now()) to attempted_at (the\n")
	sb.WriteString("# fetch's now(), just before Work starts); both on the database's clock. 1,000 of each, one per\n")
	sb.WriteString("# transaction, spaced as shown; certworker --concurrency 4 and --poll-interval 30s with a fake issuer\n")
	sb.WriteString("# answering at once; River MaxWorkers 4, a worker that returns at once. Each run on a fresh database\n")
	sb.WriteString("# of one server, one after another. River's FetchCooldown (default 100 ms) also spaces the\n")
	sb.WriteString("# notifications its inserts send; the tuned run sets it to River's minimum, 1 ms.\n")
	fmt.Fprintf(&sb, "# %s, %s %s/%s, %d CPUs, PostgreSQL image %s (local container, fsync=off)\n",
		time.Now().UTC().Format(time.RFC3339), runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), pgtest.Image())
	fmt.Fprintf(&sb, "# command: %s (make bench runs it)\n\n", benchCommand)
	tw := tabwriter.NewWriter(&sb, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "who\tspacing\tn\tp50 ms\tp95 ms\tp99 ms\tmax ms\tload\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%s\t\n", r.who, r.spacing, r.d.n, r.d.p50, r.d.p95, r.d.p99, r.d.max, r.load)
	}
	require.NoError(b, tw.Flush())
	sb.WriteString("\ncertworker / River (p50, p99):\n")
	for i := 0; i+2 < len(results); i += 3 {
		cw := results[i]
		for _, r := range results[i+1 : i+3] {
			fmt.Fprintf(&sb, "  spacing %s, vs %s: p50 %.3fx, p99 %.3fx\n", cw.spacing, r.who, cw.d.p50/r.d.p50, cw.d.p99/r.d.p99)
		}
	}
	b.Log("\n" + sb.String())
	require.NoError(b, os.WriteFile(benchFile, []byte(sb.String()), 0o644))
}

func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(raw))[0]
}
