package queue_test

// BenchmarkPlansAtAMillion shows the plan and time of every statement the worker runs
// on a wake-up, a timer or a scrape, on the shape of a large installation: 1,000,000
// domains of 10,000 tenants, 100,000 of them due, most of the rest active with a
// certificate. It writes them to bench/plans.txt.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// recorder runs statements on a pool and keeps each one's text and arguments, so
// that the benchmark explains the statements the queue really runs, not copies.
type recorder struct {
	*pgxpool.Pool
	mu   sync.Mutex
	seen []recorded
}

type recorded struct {
	sql  string
	args []any
}

func (r *recorder) keep(sql string, args []any) {
	if !explainable(sql) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, recorded{sql, args})
}

func (r *recorder) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	r.keep(sql, args)
	return r.Pool.Query(ctx, sql, args...)
}

func (r *recorder) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	r.keep(sql, args)
	return r.Pool.QueryRow(ctx, sql, args...)
}

func (r *recorder) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	r.keep(sql, args)
	return r.Pool.Exec(ctx, sql, args...)
}

// explainable: EXPLAIN takes sql (a query or a write; not SHOW, which the sanitiser
// runs once per pool, nor SET).
func explainable(sql string) bool {
	f := strings.Fields(sql)
	if len(f) == 0 {
		return false
	}
	switch strings.ToUpper(f[0]) {
	case "SELECT", "WITH", "UPDATE", "INSERT", "DELETE":
		return true
	}
	return false
}

// take returns what was recorded since the last take.
func (r *recorder) take() []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.seen
	r.seen = nil
	return out
}

// fillMillion builds the installation: 10,000 tenants of 100 domains each.
func fillMillion(tb testing.TB, pool *pgxpool.Pool) {
	tb.Helper()
	ctx := context.Background()
	for _, sql := range []string{
		`INSERT INTO proxy_tenants (name, slug, email) SELECT 't' || g, 't' || g, 't@x' FROM generate_series(1, 10000) g`,
		// Per tenant, domain k of 100: k < 10 due (a first issuance, a retry whose
		// backoff ran out, a renewal), k = 10 failed, k = 11 in flight (every
		// other lease run out), the rest active.
		`INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status,
             ssl_provider, ssl_attempts, ssl_last_attempt_at, ssl_claim_token, ssl_claimed_by, ssl_lease_expires_at,
             ssl_expires_at, ssl_renew_by)
         SELECT t.id, 'd' || k || '.' || t.slug || '.example', 'verified', 'tok',
                CASE WHEN k < 10 THEN 'pending' WHEN k = 10 THEN 'failed' WHEN k = 11 THEN 'provisioning' ELSE 'active' END,
                'acme',
                CASE WHEN k BETWEEN 3 AND 5 THEN 2 WHEN k = 10 THEN 10 ELSE 0 END,
                CASE WHEN k BETWEEN 3 AND 5 OR k >= 10 THEN now() - interval '1 hour' END,
                CASE WHEN k = 11 THEN gen_random_uuid() END,
                CASE WHEN k = 11 THEN 'bench' END,
                CASE WHEN k = 11 THEN now() + CASE WHEN t.n % 2 = 0 THEN interval '1 minute' ELSE interval '-1 minute' END END,
                CASE WHEN k >= 8 THEN now() + interval '30 days' END,
                CASE WHEN k >= 8 THEN now() + interval '12 days' END
         FROM (SELECT id, slug, row_number() OVER () AS n FROM proxy_tenants) t, generate_series(0, 99) k`,
		// A certificate for every active domain and for the due renewals: renewal times
		// spread over the next 60 days, one in a hundred due now; renewal information
		// asked again within the next 6 hours (the CA's usual Retry-After), one in a
		// hundred due now.
		`INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at, not_before, renew_at, ari_next_at)
         SELECT domain, 'pem', 'key', now() + interval '30 days', now() - interval '60 days',
                now() + ((hashtext(domain) & 2147483647) % 6000 - 60) * interval '864 seconds',
                now() + ((hashtext(domain) & 2147483647) % 600 - 6) * interval '36 seconds'
         FROM proxy_domains WHERE ssl_status = 'active' OR ssl_expires_at IS NOT NULL`,
		// Profiles: one domain in ten names a profile of its own (k a multiple of 10), and
		// its certificate was issued under it but for one in a hundred of them, whose tenant
		// just changed it; every other certificate is under the fleet's profile.
		`UPDATE proxy_domains SET ssl_profile = 'shortlived' WHERE domain LIKE 'd_0.%' OR domain LIKE 'd0.%'`,
		`UPDATE proxy_certificates c SET profile = CASE
             WHEN d.ssl_profile IS NULL THEN 'classic'
             WHEN (hashtext(d.domain) & 2147483647) % 100 = 0 THEN 'classic'
             ELSE d.ssl_profile END
         FROM proxy_domains d WHERE d.domain = c.domain`,
		`VACUUM ANALYZE proxy_tenants, proxy_domains, proxy_certificates`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			tb.Fatalf("fill: %v\n%s", err, sql)
		}
	}
}

// explain runs EXPLAIN (ANALYZE, BUFFERS) of a recorded statement seven times, each in
// a transaction rolled back, and returns the last plan and the median execution time.
func explain(tb testing.TB, pool *pgxpool.Pool, r recorded) (string, float64) {
	tb.Helper()
	ctx := context.Background()
	var plan string
	var times []float64
	for range 7 {
		tx, err := pool.Begin(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+r.sql, r.args...)
		if err != nil {
			_ = tx.Rollback(ctx)
			tb.Fatalf("explain: %v\n%s", err, r.sql)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			tb.Fatal(err)
		}
		_ = tx.Rollback(ctx)
		plan = strings.Join(lines, "\n")
		times = append(times, planMS(tb, plan, "Execution Time"))
	}
	slices.Sort(times)
	return plan, times[len(times)/2]
}

func planMS(tb testing.TB, plan, label string) float64 {
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

func BenchmarkPlansAtAMillion(b *testing.B) {
	pool, _ := pgtest.NewPool(b)
	start := time.Now()
	fillMillion(b, pool)
	b.Logf("filled in %s", time.Since(start).Round(time.Second))
	rec := &recorder{Pool: pool}
	q := queue.New(rec, issuing.DefaultConfig())
	ctx := context.Background()
	const dir = "https://ca.invalid/directory"
	var tokens []string
	if err := pool.QueryRow(ctx, `SELECT array_agg(ssl_claim_token::text) FROM (SELECT ssl_claim_token FROM proxy_domains WHERE ssl_status = 'provisioning' LIMIT 16) t`).Scan(&tokens); err != nil {
		b.Fatal(err)
	}
	steps := []struct {
		name string
		run  func() error
	}{
		{"claim, 16 at a time (wake-up, refill)", func() error { _, err := q.Claim(ctx, "bench", dir, 16); return err }},
		{"next due time (every pass that ends the queue)", func() error { _, _, err := q.NextDue(ctx, dir); return err }},
		{"next maintenance time (maintenance timer)", func() error { _, err := q.NextMaintenance(ctx); return err }},
		{"reclaim abandoned claims (maintenance)", func() error { _, err := q.ReclaimAbandoned(ctx); return err }},
		{"mark renewals (maintenance)", func() error { _, err := q.MarkRenewals(ctx); return err }},
		{"promote urgent renewals (maintenance)", func() error { _, err := q.PromoteUrgentRenewals(ctx); return err }},
		{"next renewal-information read (ARI loop)", func() error { _, _, err := q.NextRenewalInfo(ctx); return err }},
		{"take 16 renewal-information tokens (ARI loop)", func() error {
			_, _, err := q.TakeRenewalInfoTokens(ctx, dir, 16, issuing.DefaultRenewalInfoPerSecond)
			return err
		}},
		{"claim 16 renewal-information reads (ARI loop)", func() error { _, _, err := q.ClaimRenewalInfo(ctx, 16); return err }},
		{"requeue certificates of a changed profile (housekeeping)", func() error { _, err := q.RequeueProfileChanges(ctx); return err }},
		{"renew 16 leases (heartbeat)", func() error { _, err := q.Heartbeat(ctx, tokens); return err }},
		{"hand back untracked claims", func() error { _, err := q.ReleaseUntracked(ctx, "bench", tokens); return err }},
		{"status overview (certworker status)", func() error { _, err := q.Overview(ctx); return err }},
	}
	var out strings.Builder
	fmt.Fprintf(&out, "# The worker's statements at 1,000,000 domains of 10,000 tenants: 100,000 due (first\n")
	fmt.Fprintf(&out, "# issuances, retries, renewals), 10,000 failed, 10,000 in flight (half of the leases run\n")
	fmt.Fprintf(&out, "# out), 880,000 active with a certificate (renewal times over 60 days); 100,000 name a\n")
	fmt.Fprintf(&out, "# profile of their own (80,000 active, about 800 of whose certificates are of another\n")
	fmt.Fprintf(&out, "# profile). Each statement is\n")
	fmt.Fprintf(&out, "# the one the queue runs (recorded, then explained with its arguments), EXPLAIN ANALYZE\n")
	fmt.Fprintf(&out, "# seven times, each rolled back; the time is the median execution time.\n")
	fmt.Fprintf(&out, "# %s, %s, %d CPUs, load average %s, PostgreSQL image %s\n", time.Now().UTC().Format(time.RFC3339),
		runtime.Version(), runtime.NumCPU(), loadAvg(), pgtest.Image())
	fmt.Fprintf(&out, "# command: make bench (go test -run '^$' -bench BenchmarkPlansAtAMillion -benchtime 1x ./queue/)\n\n")
	var summary strings.Builder
	b.ResetTimer()
	for _, s := range steps {
		rec.take()
		if err := s.run(); err != nil {
			b.Fatalf("%s: %v", s.name, err)
		}
		for i, r := range rec.take() {
			plan, ms := explain(b, pool, r)
			b.ReportMetric(ms, strings.Fields(s.name)[0]+fmt.Sprint(i)+"-ms")
			fmt.Fprintf(&summary, "%9.3f ms  %s%s\n", ms, s.name, statementSuffix(i))
			fmt.Fprintf(&out, "## %s%s: %.3f ms\n%s\n\n", s.name, statementSuffix(i), ms, plan)
		}
	}
	// The claim reads only what it can take. 50,000 rows whose backoff has not run out
	// and 50,000 under one registered domain's pause, all at the head of the queue
	// (placed before every due row), in line as a hand edit, a longer --retry-base or a
	// pause that just started leaves them. The first claim after takes them out of line
	// (its wall time is reported); the claim of 16 is then explained as above.
	heldBack(b, pool)
	took := time.Now()
	claims := 0
	for inLine := 1; inLine > 0; claims++ {
		if _, err := q.Claim(ctx, "bench", dir, 16); err != nil {
			b.Fatal(err)
		}
		if err := pool.QueryRow(ctx, `
SELECT count(*) FROM proxy_domains
WHERE ssl_status = 'pending' AND ssl_held IS NULL AND (domain LIKE '%.backoff.example' OR domain LIKE '%.paused.example')`).Scan(&inLine); err != nil {
			b.Fatal(err)
		}
	}
	fmt.Fprintf(&summary, "%9.3f ms  the %d claims that took those rows out of line (wall time, each a claim of 16)\n",
		float64(time.Since(took).Microseconds())/1000, claims)
	// Explained as they are left (the claim's index still holds the entries of the
	// rows taken out, until a vacuum), then after VACUUM, as autovacuum leaves them.
	for _, when := range []string{"before a vacuum", "after VACUUM"} {
		if when == "after VACUUM" {
			if _, err := pool.Exec(ctx, `VACUUM proxy_domains`); err != nil {
				b.Fatal(err)
			}
		}
		rec.take()
		if _, err := q.Claim(ctx, "bench", dir, 16); err != nil {
			b.Fatal(err)
		}
		heldName := "claim, 16 at a time, behind 50,000 rows in backoff and 50,000 under a pause, " + when
		for i, r := range rec.take() {
			plan, ms := explain(b, pool, r)
			b.ReportMetric(ms, "claim-held-back-"+strings.Fields(when)[0]+fmt.Sprint(i)+"-ms")
			fmt.Fprintf(&summary, "%9.3f ms  %s%s\n", ms, heldName, statementSuffix(i))
			fmt.Fprintf(&out, "## %s%s: %.3f ms\n%s\n\n", heldName, statementSuffix(i), ms, plan)
		}
	}
	// The claim with a second CA behind the same rows, put back in line, and then behind
	// 500,000 (400,000 more under the pause): the first claims take them out of line
	// (their wall time, and the longest statement, are reported), and the claim of 16 is
	// explained as above.
	cfg := issuing.DefaultConfig()
	cfg.Fallback = &issuing.Fallback{Directory: "https://second.invalid/directory", After: time.Hour}
	routed := queue.New(rec, cfg)
	for _, held := range []string{"100,000", "500,000"} {
		if held == "500,000" {
			moreHeldBack(b, pool)
		}
		if _, err := pool.Exec(ctx, `UPDATE proxy_domains SET ssl_held = NULL, ssl_held_until = NULL
WHERE ssl_status = 'pending' AND (domain LIKE '%.backoff.example' OR domain LIKE '%.paused.example')`); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `VACUUM (ANALYZE, PARALLEL 0) proxy_domains`); err != nil {
			b.Fatal(err)
		}
		took, claims, longest := time.Now(), 0, time.Duration(0)
		for inLine := 1; inLine > 0; claims++ {
			t0 := time.Now()
			if _, err := routed.Claim(ctx, "bench", dir, 16); err != nil {
				b.Fatalf("routed claim behind %s held rows: %v", held, err)
			}
			longest = max(longest, time.Since(t0))
			if err := pool.QueryRow(ctx, `
SELECT count(*) FROM proxy_domains
WHERE ssl_status = 'pending' AND ssl_held IS NULL AND (domain LIKE '%.backoff.example' OR domain LIKE '%.paused.example')`).Scan(&inLine); err != nil {
				b.Fatal(err)
			}
		}
		fmt.Fprintf(&summary, "%9.3f ms  the %d claims with a second CA that took %s held rows out of line (wall time, each a claim of 16; the longest %.0f ms)\n",
			float64(time.Since(took).Microseconds())/1000, claims, held, float64(longest.Microseconds())/1000)
		if _, err := pool.Exec(ctx, `VACUUM (PARALLEL 0) proxy_domains`); err != nil {
			b.Fatal(err)
		}
		rec.take()
		if _, err := routed.Claim(ctx, "bench", dir, 16); err != nil {
			b.Fatal(err)
		}
		heldName := "claim with a second CA, 16 at a time, behind " + held + " held rows, after VACUUM"
		for i, r := range rec.take() {
			plan, ms := explain(b, pool, r)
			b.ReportMetric(ms, "claim-routed-"+strings.ReplaceAll(held, ",", "")+"-"+fmt.Sprint(i)+"-ms")
			fmt.Fprintf(&summary, "%9.3f ms  %s%s\n", ms, heldName, statementSuffix(i))
			fmt.Fprintf(&out, "## %s%s: %.3f ms\n%s\n\n", heldName, statementSuffix(i), ms, plan)
		}
	}
	b.StopTimer()
	writeBenchFile(b, "plans.txt", summary.String()+"\n"+out.String())
}

// moreHeldBack adds 400,000 pending rows under paused.example at the head of the
// queue, beside heldBack's 100,000.
func moreHeldBack(tb testing.TB, pool *pgxpool.Pool) {
	tb.Helper()
	ctx := context.Background()
	for _, sql := range []string{
		`INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
         SELECT t.id, 'q' || g || '.paused.example', 'verified', 'tok', 'pending', 'acme'
         FROM generate_series(1, 400000) g
         JOIN (SELECT id, row_number() OVER () - 1 AS n FROM proxy_tenants) t ON t.n = g % 10000`,
		`UPDATE proxy_domains SET ssl_queue_tier = 2, ssl_queue_seq = -1 WHERE domain LIKE 'q%.paused.example'`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			tb.Fatalf("more held back: %v\n%s", err, sql)
		}
	}
}

// heldBack adds 100,000 pending rows at the head of the queue that the claim cannot
// take: 50,000 tried a minute ago with 3 attempts behind them (backoff 8 minutes), and
// 50,000 names under paused.example, whose registered domain is paused for an hour.
func heldBack(tb testing.TB, pool *pgxpool.Pool) {
	tb.Helper()
	ctx := context.Background()
	for _, sql := range []string{
		`INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status,
             ssl_provider, ssl_attempts, ssl_last_attempt_at)
         SELECT t.id,
                CASE WHEN g <= 50000 THEN 'b' || g || '.backoff.example' ELSE 'p' || g || '.paused.example' END,
                'verified', 'tok', 'pending', 'acme',
                CASE WHEN g <= 50000 THEN 3 ELSE 0 END,
                CASE WHEN g <= 50000 THEN now() - interval '1 minute' END
         FROM generate_series(1, 100000) g
         JOIN (SELECT id, row_number() OVER () - 1 AS n FROM proxy_tenants) t ON t.n = g % 10000`,
		`UPDATE proxy_domains SET ssl_queue_tier = 2, ssl_queue_seq = -1
         WHERE domain LIKE '%.backoff.example' OR domain LIKE '%.paused.example'`,
		`INSERT INTO certworker_pauses (scope, key, source, paused_until, reason)
         VALUES ('registered_domain', 'paused.example', 'rate_limit', now() + interval '1 hour', 'bench')`,
		`VACUUM ANALYZE proxy_domains`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			tb.Fatalf("held back: %v\n%s", err, sql)
		}
	}
}

func statementSuffix(i int) string {
	if i == 0 {
		return ""
	}
	return fmt.Sprintf(" (statement %d)", i+1)
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

func writeBenchFile(tb testing.TB, name, text string) {
	tb.Helper()
	if err := os.WriteFile(filepath.Join("..", "bench", name), []byte(text), 0o644); err != nil {
		tb.Fatalf("results file: %v", err)
	}
}
