package main

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

const (
	// restDomains is the fleet's size: every domain active, its certificate far from
	// renewal, and its renewal information not due for hours: nothing to do.
	restDomains = 1_000_000
	// restInstances is the fleet.
	restInstances = 3
	// restWindow is how long the fleet runs: one housekeeping interval (10 minutes),
	// so that each step runs as often as it does in production (the housekeeping at
	// each holder's first maintenance, once in the window), in real time.
	restWindow = 10 * time.Minute
)

// restIssuer is the fake issuer with renewal information, so that each instance runs
// its renewal-information loop as `certworker run` does with an ACME issuer (nothing
// is due, so it is never called).
type restIssuer struct{ *fakeissuer.Issuer }

func (restIssuer) RenewalInfo(context.Context, string) (*issuing.RenewalWindow, error) {
	return nil, issuing.ErrNoRenewalInfo
}

// BenchmarkFleetAtRest: three instances, each with its worker (poll 30 s) and its
// fleet statistics (a minute), as `certworker run` wires them, against 1,000,000
// domains with nothing due, for one housekeeping interval in real time. It reads
// pg_stat_statements (the server started with it preloaded, planning tracked) and
// reports statements per minute and database time per hour by statement, extrapolated
// from the window. The table goes to $FLEET_REST_FILE, else bench/fleet-at-rest.txt.
func BenchmarkFleetAtRest(b *testing.B) {
	srv := pgtest.StartServer(b, "shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=top",
		"pg_stat_statements.track_planning=on", "pg_stat_statements.max=5000")
	pool, dsn := srv.NewPool(b)
	ctx := context.Background()
	loadStart := loadAverage()
	start := time.Now()
	tenant := pgtest.Tenant(b, pool)
	for _, st := range []string{
		`INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token,
             ssl_status, ssl_provider, ssl_attempts, ssl_expires_at)
         SELECT $1, 'rest' || g || '.example', 'verified', 'tok', 'active', 'acme', 0,
                now() + (50 + g % 40) * interval '1 day'
         FROM generate_series(1, ` + fmt.Sprint(restDomains) + `) g`,
		`INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at, renew_at, ari_next_at)
         SELECT domain, 'pem', 'key', ssl_expires_at, ssl_expires_at - interval '30 days',
                now() + interval '6 hours' + (random() * interval '6 hours')
         FROM proxy_domains WHERE tenant_id = $1`,
	} {
		_, err := pool.Exec(ctx, st, tenant)
		require.NoError(b, err)
	}
	_, err := pool.Exec(ctx, `VACUUM ANALYZE proxy_domains, proxy_certificates`)
	require.NoError(b, err)
	fill := time.Since(start)
	_, err = pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `SELECT pg_stat_statements_reset()`)
	require.NoError(b, err)

	b.ResetTimer()
	began := time.Now()
	for i := range restInstances {
		in := workertest.Start(b, dsn, fmt.Sprintf("rest%d", i+1), worker.Config{
			Issuer: restIssuer{fakeissuer.New(1)}, Concurrency: 4, PollInterval: 30 * time.Second, Log: zap.NewNop(),
		})
		f := newFleet(queue.New(in.Pool, issuing.DefaultConfig()), workertest.Directory, in.Owner(), fleetInterval, zap.NewNop())
		f.Start(ctx)
		b.Cleanup(f.Stop)
	}
	time.Sleep(restWindow - time.Since(began))
	window := time.Since(began)
	b.StopTimer()

	rows, err := pool.Query(ctx, `
SELECT s.calls, s.total_exec_time + s.total_plan_time, s.total_plan_time, s.query
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = current_database() AND s.query NOT LIKE '%pg_stat_statements%'
ORDER BY 2 DESC`)
	require.NoError(b, err)
	type stmt struct {
		calls           int64
		totalMS, planMS float64
		query           string
	}
	var stmts []stmt
	var calls int64
	var totalMS float64
	for rows.Next() {
		var s stmt
		require.NoError(b, rows.Scan(&s.calls, &s.totalMS, &s.planMS, &s.query))
		stmts = append(stmts, s)
		calls += s.calls
		totalMS += s.totalMS
	}
	require.NoError(b, rows.Err())
	perHour := func(ms float64) float64 { return ms / 1000 * float64(time.Hour) / float64(window) }
	perMinute := func(n int64) float64 { return float64(n) * float64(time.Minute) / float64(window) }
	b.ReportMetric(perHour(totalMS), "db-s/hour")
	b.ReportMetric(perMinute(calls), "statements/min")

	var sb strings.Builder
	sb.WriteString("# A fleet at rest: 3 instances (worker with --poll-interval 30s and the fleet statistics, as `certworker\n")
	fmt.Fprintf(&sb, "# run` wires them; a fake issuer with renewal information) against %d domains with nothing due\n", restDomains)
	sb.WriteString("# (every domain active, renewals 20 to 60 days away, renewal information not due for 6 to 12 hours),\n")
	fmt.Fprintf(&sb, "# in real time for %s (one housekeeping interval), from the instances' start. Database time is\n", window.Round(time.Second))
	sb.WriteString("# pg_stat_statements' execution plus planning time of the statements the instances sent (top level),\n")
	sb.WriteString("# extrapolated to an hour from the window.\n")
	fmt.Fprintf(&sb, "# %s, %s %s/%s, %d CPUs, PostgreSQL image %s (fsync=off); rows made in %s; load average %s at the start, %s at the end\n",
		time.Now().UTC().Format(time.RFC3339), runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), pgtest.Image(),
		fill.Round(time.Second), loadStart, loadAverage())
	sb.WriteString("# command: CERTWORKER_PG_IMAGE=certworker-postgres:15 go test -run '^$' -bench BenchmarkFleetAtRest -benchtime 1x -timeout 40m ./cmd/certworker/\n\n")
	fmt.Fprintf(&sb, "total: %.0f statements a minute, %.1f s of database time an hour (goal: 36 s or less)\n\n", perMinute(calls), perHour(totalMS))
	tw := tabwriter.NewWriter(&sb, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "db s/hour\tper minute\tmean ms\tof it planning ms\tstatement\t")
	space := regexp.MustCompile(`\s+`)
	for _, s := range stmts {
		q := space.ReplaceAllString(s.query, " ")
		if len(q) > 110 {
			q = q[:110] + "..."
		}
		mean, plan := "-", "-" // planned, not yet run to its end
		if s.calls > 0 {
			mean, plan = fmt.Sprintf("%.2f", s.totalMS/float64(s.calls)), fmt.Sprintf("%.2f", s.planMS/float64(s.calls))
		}
		fmt.Fprintf(tw, "%.2f\t%.1f\t%s\t%s\t%s\t\n", perHour(s.totalMS), perMinute(s.calls), mean, plan, q)
	}
	require.NoError(b, tw.Flush())
	b.Log("\n" + sb.String())
	file := os.Getenv("FLEET_REST_FILE")
	if file == "" {
		file = "../../bench/fleet-at-rest.txt"
	}
	require.NoError(b, os.WriteFile(file, []byte(sb.String()), 0o644))
}

func loadAverage() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(raw))[0]
}
