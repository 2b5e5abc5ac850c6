package queue_test

// BenchmarkFairness compares the claim's order of service with a first-in-first-out
// order, in one run: how long a tenant who verifies one domain waits behind another
// tenant's bulk import, and what the order costs the drain rate. Written to
// bench/fairness.txt.

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// fifoOrder is the first-in-first-out order: oldest attempt first, never tried first,
// whatever the tenant.
const fifoOrder = "ORDER BY d.ssl_last_attempt_at ASC NULLS FIRST"

const (
	fairSlots     = 16                    // --concurrency
	fairOrderTime = 25 * time.Millisecond // a fast CA's order
	fairBacklog   = 2000                  // tenant A's import
)

// fifoIndex is the index a FIFO claim reads its order from, over the rows in line as
// the claim reads them: without it the FIFO claim would sort the queue, and the
// comparison would be with a claim nobody would run.
const fifoIndex = `CREATE INDEX IF NOT EXISTS proxy_domains_claimable_idx ON proxy_domains (ssl_last_attempt_at NULLS FIRST)
    WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending' AND ssl_held IS NULL`

// withOrderIndex gives a database the index the order reads from.
func withOrderIndex(b *testing.B, pool *pgxpool.Pool, order string) {
	if order != "fifo" {
		return
	}
	if _, err := pool.Exec(context.Background(), fifoIndex); err != nil {
		b.Fatal(err)
	}
}

// claimStatement is the claim with the given order of service.
func claimStatement(order string) string {
	if order == "fifo" {
		return strings.Replace(queue.ClaimSQLForTest, queue.ClaimOrderForTest, fifoOrder, 1)
	}
	return queue.ClaimSQLForTest
}

// claimWith claims up to n rows with the statement, as Queue.Claim does (every tier,
// its first window), and returns how many it claimed.
func claimWith(ctx context.Context, pool *pgxpool.Pool, sql string, n int) (int, error) {
	cfg := issuing.DefaultConfig()
	rows, err := pool.Query(ctx, sql, cfg.MaxAttempts, cfg.RetryBase.Seconds(), cfg.RetryMax.Seconds(),
		"bench", cfg.Lease.Seconds(), n, testDirectory, 1, 3, n)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	claimed := 0
	for rows.Next() {
		if rows.RawValues()[0] != nil {
			claimed++
		}
	}
	return claimed, rows.Err()
}

// lateTenantWait runs 16 slots that claim one domain, hold it for an order's time and
// store it, over tenant A's import of 2,000 domains; a second in, tenant B verifies
// one. It returns B's wait from its verify to its claim (on the database's clock) and
// the drain rate of the whole queue.
func lateTenantWait(b *testing.B, order string) (time.Duration, float64) {
	ctx := context.Background()
	pool, _ := pgtest.NewPool(b)
	withOrderIndex(b, pool, order)
	a, other := pgtest.Tenant(b, pool), pgtest.Tenant(b, pool)
	if _, err := pool.Exec(ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_token, ssl_provider)
SELECT $1, 'a' || g || '.example', 'tok', 'acme' FROM generate_series(1, $2::int) g`, a, fairBacklog); err != nil {
		b.Fatal(err)
	}
	sql := claimStatement(order)
	start := time.Now()
	if _, err := pool.Exec(ctx, `UPDATE proxy_domains SET verification_status = 'verified' WHERE tenant_id = $1`, a); err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	done := make(chan struct{})
	for range fairSlots {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				n, err := claimWith(ctx, pool, sql, 1)
				if err != nil {
					b.Error(err)
					return
				}
				if n == 0 {
					time.Sleep(2 * time.Millisecond)
					continue
				}
				time.Sleep(fairOrderTime)
				if _, err := pool.Exec(ctx, `
UPDATE proxy_domains SET ssl_status = 'active', ssl_claim_token = NULL, ssl_claimed_by = NULL, ssl_lease_expires_at = NULL
WHERE ssl_status = 'provisioning' AND ssl_claimed_by = 'bench' AND ctid = (
    SELECT ctid FROM proxy_domains WHERE ssl_status = 'provisioning' AND ssl_claimed_by = 'bench' LIMIT 1 FOR UPDATE SKIP LOCKED)`); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	time.Sleep(time.Second)
	b1 := pgtest.Domain(b, pool, other, "b1.example")
	var wait time.Duration
	for {
		var claimed bool
		if err := pool.QueryRow(ctx, `
SELECT ssl_status <> 'pending', COALESCE(ssl_last_attempt_at - ssl_queued_at, interval '0') FROM proxy_domains WHERE id = $1`, b1).
			Scan(&claimed, &wait); err != nil {
			b.Fatal(err)
		}
		if claimed {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	for {
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM proxy_domains WHERE ssl_status <> 'active'`).Scan(&left); err != nil {
			b.Fatal(err)
		}
		if left == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(done)
	wg.Wait()
	return wait, float64(fairBacklog+1) / time.Since(start).Seconds()
}

// bareDrain claims 10,000 due domains n at a time with the statement, and returns the
// claims a second.
func bareDrain(b *testing.B, order string, n int) float64 {
	ctx := context.Background()
	pool, _ := pgtest.NewPool(b)
	withOrderIndex(b, pool, order)
	tn := pgtest.Tenant(b, pool)
	if _, err := pool.Exec(ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_provider)
SELECT $1, 'd' || g || '.example', 'verified', 'tok', 'acme' FROM generate_series(1, 10000) g`, tn); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE proxy_domains`); err != nil {
		b.Fatal(err)
	}
	sql := claimStatement(order)
	start := time.Now()
	claimed := 0
	for {
		k, err := claimWith(ctx, pool, sql, n)
		if err != nil {
			b.Fatal(err)
		}
		if k == 0 {
			break
		}
		claimed += k
	}
	if claimed != 10000 {
		b.Fatalf("claimed %d, want 10000", claimed)
	}
	return float64(claimed) / time.Since(start).Seconds()
}

func BenchmarkFairness(b *testing.B) {
	var s strings.Builder
	fmt.Fprintf(&s, "# A tenant's bulk import against a tenant who verifies one domain a second later: the\n")
	fmt.Fprintf(&s, "# claim's order of service (tiers, then one turn per tenant a round) beside the FIFO order it\n")
	fmt.Fprintf(&s, "# replaced (oldest attempt first), the same statement otherwise, in one run. %d slots each\n", fairSlots)
	fmt.Fprintf(&s, "# claim one domain, hold it %s (a fast CA's order) and store it; tenant A verifies %d\n", fairOrderTime, fairBacklog)
	fmt.Fprintf(&s, "# domains in one statement, tenant B one domain a second later. B's wait is on the\n")
	fmt.Fprintf(&s, "# database's clock, from its verify to its claim. Then the bare claim's drain rate over\n")
	fmt.Fprintf(&s, "# 10,000 due domains, 1 and 16 a statement.\n")
	fmt.Fprintf(&s, "# %s, %s, %d CPUs, load average %s, PostgreSQL image %s\n", time.Now().UTC().Format(time.RFC3339),
		runtime.Version(), runtime.NumCPU(), loadAvg(), pgtest.Image())
	fmt.Fprintf(&s, "# command: make bench (go test -run '^$' -bench BenchmarkFairness -benchtime 1x ./queue/)\n\n")
	waits, rates := map[string]time.Duration{}, map[string]float64{}
	for _, order := range []string{"fair", "fifo"} {
		b.Run("late-tenant/"+order, func(b *testing.B) {
			waits[order], rates[order] = lateTenantWait(b, order)
			b.ReportMetric(float64(waits[order].Microseconds())/1000, "b-wait-ms")
		})
	}
	fmt.Fprintf(&s, "order  B's verify to claim  drain rate (domains/s)\n")
	for _, order := range []string{"fair", "fifo"} {
		fmt.Fprintf(&s, "%-5s  %17.1f ms  %10.0f\n", order, float64(waits[order].Microseconds())/1000, rates[order])
	}
	fmt.Fprintf(&s, "B waits %.0fx less with the order of service\n\n", waits["fifo"].Seconds()/waits["fair"].Seconds())
	fmt.Fprintf(&s, "bare claim    fair/s    fifo/s  fair/fifo\n")
	for _, n := range []int{1, 16} {
		var fair, fifo float64
		b.Run(fmt.Sprintf("bare-drain/batch-%d", n), func(b *testing.B) {
			fair, fifo = bareDrain(b, "fair", n), bareDrain(b, "fifo", n)
			b.ReportMetric(fair/fifo, "fair/fifo")
		})
		fmt.Fprintf(&s, "%2d a claim  %8.0f  %8.0f  %9.2f\n", n, fair, fifo, fair/fifo)
	}
	writeBenchFile(b, "fairness.txt", s.String())
}
