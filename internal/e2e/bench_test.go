package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/queue/worker"
)

const (
	// benchDomains is how many domains a tenant verifies at once in the benchmark.
	benchDomains = 200
	// benchSleepSeconds is Pebble's validation sleep: each of its three validation
	// requests per challenge sleeps a whole number of seconds drawn from
	// [0, benchSleepSeconds), so 2 gives 0 or 1 s (1 s for 7 challenges in 8), the
	// least that is not "no sleep" (1 would always draw 0). It stands for the
	// seconds a real CA takes to validate, which is what concurrency overlaps.
	benchSleepSeconds = 2
	// benchFile is the table the benchmark writes, from the package's directory.
	benchFile = "../../bench/issuance.txt"
	// benchCommand is how the table is made.
	benchCommand = "CERTWORKER_PG_IMAGE=certworker-postgres:15 go test -run '^$' -bench BenchmarkIssuance -benchtime 1x -timeout 40m ./internal/e2e/"
)

// issuanceResult is one sub-benchmark's measurement.
type issuanceResult struct {
	concurrency int
	elapsed     time.Duration
	perMinute   float64
	// orderP50 and orderP95 are claim-to-stored times of the orders.
	orderP50, orderP95 time.Duration
	orderRequests      int
}

// BenchmarkIssuance: a tenant verifies 200 domains in one statement; the time until
// the last certificate is stored, at worker concurrency 1, 4 and 16 (issue #4). The
// real worker and ACME issuer, against Pebble with its validation sleep on, each
// sub-benchmark on a fresh database and a fresh Pebble of the same configuration.
// It reports certificates per minute and writes the table to bench/issuance.txt.
//
// Time is measured on the database's clock: from the transaction that verifies the
// domains to the last proxy_certificates.updated_at (the storing transaction's).
func BenchmarkIssuance(b *testing.B) {
	var results []issuanceResult
	for _, c := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("concurrency=%d", c), func(b *testing.B) {
			var r issuanceResult
			for range b.N {
				r = benchIssuance(b, c)
			}
			b.ReportMetric(r.perMinute, "certs/min")
			b.ReportMetric(r.elapsed.Seconds(), "s/200certs")
			results = append(results, r)
		})
	}
	if len(results) == 3 {
		writeIssuanceTable(b, results)
	}
}

func benchIssuance(b *testing.B, concurrency int) issuanceResult {
	b.StopTimer()
	w := newWorld(b, pebbletest.Options{ValidationSleep: true, SleepSeconds: benchSleepSeconds})
	in := w.startWorker(b, "bench", w.acmeConfig(), worker.Config{Concurrency: concurrency, PollInterval: 30 * time.Second})
	in.WaitForLog(b, "pass finished", 1, 30*time.Second)

	ids := make([]string, benchDomains)
	for i := range ids {
		require.NoError(b, w.pool.QueryRow(w.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_method, verification_token, ssl_provider)
VALUES ($1, $2, 'http', 'bench-token', 'acme') RETURNING id::text`, w.tenant, randomName(fmt.Sprintf("b%03d", i))).Scan(&ids[i]))
	}
	b.StartTimer()
	var verifiedAt time.Time
	require.NoError(b, w.pool.QueryRow(w.ctx, `
WITH v AS (UPDATE proxy_domains SET verification_status = 'verified', updated_at = now()
           WHERE tenant_id = $1 RETURNING 1)
SELECT now() FROM v LIMIT 1`, w.tenant).Scan(&verifiedAt))
	waitFor(b, 20*time.Minute, "every certificate", func() bool {
		st := w.statuses(b)
		require.Zero(b, st["failed"], "a domain failed")
		return st["active"] == benchDomains
	})
	b.StopTimer()

	r := issuanceResult{concurrency: concurrency, orderRequests: w.ca.OrderRequests()}
	var last time.Time
	require.NoError(b, w.pool.QueryRow(w.ctx, `SELECT max(updated_at) FROM proxy_certificates`).Scan(&last))
	r.elapsed = last.Sub(verifiedAt)
	r.perMinute = float64(benchDomains) / r.elapsed.Minutes()

	rows, err := w.pool.Query(w.ctx, `
SELECT extract(epoch FROM c.updated_at - d.ssl_last_attempt_at)
FROM proxy_domains d JOIN proxy_certificates c ON c.domain = d.domain WHERE d.tenant_id = $1`, w.tenant)
	require.NoError(b, err)
	var orders []time.Duration
	for rows.Next() {
		var secs float64
		require.NoError(b, rows.Scan(&secs))
		orders = append(orders, time.Duration(secs*float64(time.Second)))
	}
	require.NoError(b, rows.Err())
	slices.Sort(orders)
	r.orderP50 = orders[len(orders)/2]
	r.orderP95 = orders[len(orders)*95/100]
	b.Logf("concurrency %d: %d certificates in %s (%.1f/min); order p50 %s p95 %s",
		concurrency, benchDomains, r.elapsed.Round(time.Millisecond), r.perMinute,
		r.orderP50.Round(time.Millisecond), r.orderP95.Round(time.Millisecond))
	return r
}

// writeIssuanceTable writes bench/issuance.txt: the three concurrencies side by
// side, with their ratios to concurrency 1.
func writeIssuanceTable(b *testing.B, results []issuanceResult) {
	var sb strings.Builder
	fmt.Fprintf(&sb, "# Issuance throughput (issue #4): %d domains verified in one statement, until the last\n", benchDomains)
	sb.WriteString("# certificate is stored. Real worker + acme.Issuer + HTTP-01 responder, in-process Pebble\n")
	fmt.Fprintf(&sb, "# with validation sleep on (SleepSeconds %d: each of its 3 validation requests sleeps 0 or 1 s;\n", benchSleepSeconds)
	sb.WriteString("# the smallest sleep there is, as 1 would draw 0 s every time), challenge Retry-After 1 s,\n")
	sb.WriteString("# no nonce rejection, authorization reuse off (Pebble still reuses about 1 in 100). A fresh\n")
	sb.WriteString("# database and Pebble per concurrency. Times on the database's clock; order = claim to stored.\n")
	fmt.Fprintf(&sb, "# %s, %s %s/%s, %d CPUs, PostgreSQL image %s\n", time.Now().UTC().Format(time.RFC3339),
		runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), pgtest.Image())
	fmt.Fprintf(&sb, "# command: %s\n\n", benchCommand)
	tw := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "concurrency\tdomains\tseconds\tcerts/min\tvs c=1\torder p50 s\torder p95 s\tnew-order requests\t")
	base := results[0].perMinute
	for _, r := range results {
		fmt.Fprintf(tw, "%d\t%d\t%.1f\t%.1f\t%.2fx\t%.2f\t%.2f\t%d\t\n", r.concurrency, benchDomains, r.elapsed.Seconds(),
			r.perMinute, r.perMinute/base, r.orderP50.Seconds(), r.orderP95.Seconds(), r.orderRequests)
	}
	require.NoError(b, tw.Flush())
	path := filepath.Clean(benchFile)
	require.NoError(b, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(b, os.WriteFile(path, []byte(sb.String()), 0o644))
	b.Logf("wrote %s:\n%s", path, sb.String())
}
