package queue_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// fleetDomains is the size of the installation the fleet statistics must stay cheap at.
const fleetDomains = 1_000_000

// BenchmarkFleetStats1M shows the plan and the server's execution time of each of
// FleetStats's statements at a million domains, the shape of a mature installation:
// 97% active with a certificate (renewal time in the future), 1% queued, 1% retrying
// with a certificate close to expiry, 0.5% failed, 0.5% provisioning; a few pauses and
// a ledger of 300 orders. Then the whole FleetStats call, as the fleet collector runs
// it. Plans and times go to bench/fleet-stats.txt.
func BenchmarkFleetStats1M(b *testing.B) {
	d := newBenchDB(b)
	start := time.Now()
	d.fillFleet(b)
	fill := time.Since(start)

	var out strings.Builder
	fmt.Fprintf(&out, "# FleetStats at %d domains (queue/stats.go), written by BenchmarkFleetStats1M.\n", fleetDomains)
	fmt.Fprintf(&out, "# command: CERTWORKER_PG_IMAGE=certworker-postgres:15 go test -run '^$' -bench FleetStats1M -benchtime 1x -timeout 30m ./queue/\n")
	fmt.Fprintf(&out, "# load: %s at the start (1-minute load average; the machine is shared)\n", loadAvg())
	fmt.Fprintf(&out, "# method: rows made with generate_series (%s), VACUUM ANALYZE; each statement run 7 times under\n", fill.Round(time.Second))
	fmt.Fprintf(&out, "# EXPLAIN (ANALYZE, BUFFERS) in a read-only transaction, median of the server's execution time;\n")
	fmt.Fprintf(&out, "# then FleetStats itself 7 times from this process, median wall time (round trips included).\n\n")
	args := map[string][]any{
		"status counts":        nil,
		"totals":               nil,
		"expiring unrenewed":   {[]float64{7 * 86400, 3 * 86400, 86400}, 7 * 86400.0},
		"pending over an hour": {3600.0},
		"pauses":               {fleetDirectory},
		"ledger":               {fleetDirectory},
	}
	for _, st := range queue.FleetStatementsForTest {
		var execs []float64
		var plan string
		for range 7 {
			plan = d.explainReadOnly(b, st.SQL, args[st.Name]...)
			execs = append(execs, planMS(b, plan, "Execution Time"))
		}
		slices.Sort(execs)
		if strings.Contains(plan, "Seq Scan on proxy_domains") || strings.Contains(plan, "Seq Scan on proxy_certificates") {
			b.Errorf("%s reads a whole table:\n%s", st.Name, plan)
		}
		b.ReportMetric(execs[3], "exec-ms/"+strings.ReplaceAll(st.Name, " ", "-"))
		fmt.Fprintf(&out, "== %s: median execution %.2f ms (min %.2f, max %.2f)\n%s\n\n", st.Name, execs[3], execs[0], execs[6], plan)
	}

	var walls []time.Duration
	var s queue.FleetStats
	for range 7 {
		t0 := time.Now()
		var err error
		s, err = d.q.FleetStats(d.ctx, fleetDirectory)
		if err != nil {
			b.Fatal(err)
		}
		walls = append(walls, time.Since(t0))
	}
	slices.Sort(walls)
	b.ReportMetric(ms(walls[3]), "fleetstats-ms")
	fmt.Fprintf(&out, "== FleetStats: median %.1f ms (min %.1f, max %.1f); load %s at the end\n", ms(walls[3]), ms(walls[0]), ms(walls[6]), loadAvg())
	fmt.Fprintf(&out, "   domains %v, verified %d, valid %d, expiring unrenewed (7d, 3d, 1d) %v, pending over an hour %d, paused %v\n",
		s.Domains, s.Verified, s.Valid, s.ExpiringUnrenewed, s.PendingOverHour, s.Paused)
	writeBenchFile(b, "fleet-stats.txt", out.String())
}

const fleetDirectory = "https://ca.example/directory"

// benchDB is one benchmark's database: fresh, migrated, with one tenant.
type benchDB struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	q      *queue.Queue
	tenant string
}

func newBenchDB(tb testing.TB) *benchDB {
	tb.Helper()
	pool, _ := pgtest.NewPool(tb)
	return &benchDB{ctx: context.Background(), pool: pool, q: queue.New(pool, issuing.DefaultConfig()), tenant: pgtest.Tenant(tb, pool)}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// fillFleet makes the million domains and their certificates.
func (d *benchDB) fillFleet(tb testing.TB) {
	tb.Helper()
	for _, st := range []struct {
		sql  string
		args []any
	}{
		// g % 200: 0 failed, 1 provisioning; g % 100: 2 queued (never tried), 3 retrying;
		// the rest active. Expiry spread over 30 to 90 days; retrying ones within 2 days.
		{`INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token,
             ssl_status, ssl_provider, ssl_attempts, ssl_expires_at)
         SELECT $1, 'fleet' || g || '.example', 'verified', 'tok',
                CASE WHEN g % 200 = 0 THEN 'failed' WHEN g % 200 = 1 THEN 'provisioning'
                     WHEN g % 100 IN (2, 3) THEN 'pending' ELSE 'active' END,
                'acme',
                CASE WHEN g % 200 = 0 THEN 10 WHEN g % 100 = 3 THEN 2 ELSE 0 END,
                CASE WHEN g % 100 = 2 THEN NULL
                     WHEN g % 100 = 3 THEN now() + (g % 48) * interval '1 hour'
                     ELSE now() + (30 + g % 60) * interval '1 day' END
         FROM generate_series(1, ` + fmt.Sprint(fleetDomains) + `) g`, []any{d.tenant}},
		{`INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at, renew_at)
         SELECT domain, 'pem', 'key', ssl_expires_at, ssl_expires_at - interval '30 days'
         FROM proxy_domains WHERE ssl_expires_at IS NOT NULL`, nil},
		{`INSERT INTO certworker_pauses (scope, key, source, paused_until) VALUES
             ('registered_domain', 'fleet402.example', 'rate_limit', now() + interval '1 hour'),
             ('domain', 'fleet302.example', 'rate_limit', now() + interval '1 hour'),
             ('ca', 'https://other-ca.example/dir', 'unreachable', now() + interval '1 hour')`, nil},
		{`INSERT INTO certworker_ledger (at, directory, name, registered_domain, outcome)
         SELECT now() - g * interval '30 seconds', $1, 'fleet' || g || '.example', 'fleet' || g || '.example', 'issued'
         FROM generate_series(1, 300) g`, []any{fleetDirectory}},
		{`INSERT INTO certworker_settings (id, limits) VALUES (true, '{"orders_per_account": {"count": 300, "window_seconds": 10800}}')
         ON CONFLICT (id) DO UPDATE SET limits = EXCLUDED.limits`, nil},
	} {
		if _, err := d.pool.Exec(d.ctx, st.sql, st.args...); err != nil {
			tb.Fatalf("fill: %v", err)
		}
	}
	if _, err := d.pool.Exec(d.ctx, `VACUUM ANALYZE proxy_domains, proxy_certificates, certworker_pauses, certworker_ledger`); err != nil {
		tb.Fatalf("vacuum: %v", err)
	}
}

// explainReadOnly runs EXPLAIN (ANALYZE, BUFFERS) of a statement in a read-only
// transaction, as FleetStats runs it.
func (d *benchDB) explainReadOnly(tb testing.TB, sql string, args ...any) string {
	tb.Helper()
	tx, err := d.pool.Begin(d.ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer tx.Rollback(d.ctx) //nolint:errcheck
	if _, err := tx.Exec(d.ctx, "SET TRANSACTION READ ONLY"); err != nil {
		tb.Fatal(err)
	}
	rows, err := tx.Query(d.ctx, "EXPLAIN (ANALYZE, BUFFERS) "+sql, args...)
	if err != nil {
		tb.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		tb.Fatal(err)
	}
	return strings.Join(lines, "\n")
}
