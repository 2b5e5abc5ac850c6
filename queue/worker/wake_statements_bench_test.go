package worker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// BenchmarkWakeStatements says where a wake-up's time goes in the database: the wake
// benchmark's run at 10 ms (1,000 verifies, one worker at --concurrency 4) on a server
// with pg_stat_statements (track_planning on, nested statements counted), read after
// the run: for each statement, how often it was planned and what a planning and an
// execution took. Twice, side by side: the worker's pool as `certworker run` sets
// it up (each connection warmed up for the wake path, queue.Queue.WarmUp), and
// without the warm-up. Writes bench/wake-statements.txt.
func BenchmarkWakeStatements(b *testing.B) {
	srv := pgtest.StartServer(b, "shared_preload_libraries=pg_stat_statements",
		"pg_stat_statements.track_planning=on", "pg_stat_statements.track=all")
	var out strings.Builder
	for _, warm := range []bool{true, false} {
		name := map[bool]string{true: "warmed-up", false: "cold"}[warm]
		b.Run(name, func(b *testing.B) {
			dsn := srv.NewDatabase(b)
			pool, err := queue.NewPoolWith(context.Background(), dsn, queue.Session{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(pool.Close)
			d := &benchDB{ctx: context.Background(), pool: pool, dsn: dsn, tenant: pgtest.Tenant(b, pool)}
			if _, err := pool.Exec(d.ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
				b.Fatal(err)
			}
			ids := d.insertDomains(b, wakeDomains, "pending")
			cfg := worker.Config{Issuer: fakeissuer.New(1), Concurrency: 4, PollInterval: benchPollInterval}
			session := workertest.Session(cfg)
			if !warm {
				session = queue.WorkerSession(issuing.DefaultLease)
			}
			if cfg.Pool, err = queue.NewPoolWith(d.ctx, dsn, session); err != nil {
				b.Fatal(err)
			}
			in := workertest.Start(b, dsn, "bench", cfg)
			in.WaitForLog(b, "pass finished", 1, 30*time.Second)
			if _, err := pool.Exec(d.ctx, `SELECT pg_stat_statements_reset()`); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			d.verifyOneByOne(b, ids, time.Now(), 10*time.Millisecond)
			d.waitActive(b, wakeDomains, 2*time.Minute, 50*time.Millisecond)
			b.StopTimer()
			l := d.wakeLatency(b)
			l.report(b)
			fmt.Fprintf(&out, "## %s: wake latency p50 %.2f ms, p99 %.2f ms, max %.2f ms (n=%d; spacing 10ms; load %s)\n\n",
				name, l.p50, l.p99, l.max, l.n, loadAvg())
			out.WriteString(statementTable(b, d))
			out.WriteString("\n")
		})
	}
	if b.Failed() || out.Len() == 0 {
		return
	}
	var s strings.Builder
	s.WriteString("# Where a wake-up's time goes in the database: pg_stat_statements over the wake\n")
	s.WriteString("# benchmark's run at 10 ms (1,000 verifies one per transaction, fake issuer, one\n")
	s.WriteString("# worker at --concurrency 4), reset after the worker's first pass. Statements run\n")
	s.WriteString("# 50 times or more, by total time (planning and execution). \"plans\" is how often\n")
	s.WriteString("# the server planned the statement; a prepared statement is planned at each of its\n")
	s.WriteString("# first five executions on a session, then runs on one plan. The verify is the\n")
	s.WriteString("# proxy's statement; the trigger functions' statements are nested in it.\n")
	fmt.Fprintf(&s, "# %s\n", benchEnv())
	s.WriteString("# command: go test -run '^$' -bench BenchmarkWakeStatements -benchtime 1x ./queue/worker/\n\n")
	s.WriteString(out.String())
	writeBenchFile(b, "wake-statements.txt", s.String())
}

// statementTable is pg_stat_statements' view of the run, as a table.
func statementTable(tb testing.TB, d *benchDB) string {
	tb.Helper()
	rows, err := d.pool.Query(d.ctx, `
SELECT calls, plans, mean_plan_time, max_plan_time, mean_exec_time, max_exec_time,
       total_plan_time + total_exec_time, left(regexp_replace(query, '\s+', ' ', 'g'), 70)
FROM pg_stat_statements
WHERE calls >= 50 AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY total_plan_time + total_exec_time DESC LIMIT 12`)
	if err != nil {
		tb.Fatalf("read pg_stat_statements: %v", err)
	}
	defer rows.Close()
	var s strings.Builder
	tw := tabwriter.NewWriter(&s, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "calls\tplans\tplan ms (mean/max)\texec ms (mean/max)\ttotal ms\tstatement")
	for rows.Next() {
		var calls, plans int64
		var planMean, planMax, execMean, execMax, total float64
		var q string
		if err := rows.Scan(&calls, &plans, &planMean, &planMax, &execMean, &execMax, &total, &q); err != nil {
			tb.Fatalf("read pg_stat_statements: %v", err)
		}
		fmt.Fprintf(tw, "%d\t%d\t%.3f / %.2f\t%.3f / %.2f\t%.0f\t%s\n", calls, plans, planMean, planMax, execMean, execMax, total, q)
	}
	if err := rows.Err(); err != nil {
		tb.Fatalf("read pg_stat_statements: %v", err)
	}
	_ = tw.Flush()
	return s.String()
}
