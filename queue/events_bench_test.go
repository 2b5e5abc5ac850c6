package queue_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// stubEventsSQL replaces the two functions that write events with ones that write
// nothing, keeping their signatures: the database without events to compare with.
const stubEventsSQL = `
CREATE OR REPLACE FUNCTION public.certworker_domain_event(
    p_domain_id uuid, p_tenant_id uuid, p_event text, p_reason text, p_message text, p_at timestamptz)
RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint';
CREATE OR REPLACE FUNCTION public.certworker_domain_claimed(
    p_domain_id uuid, p_tenant_id uuid, p_eligible_at timestamptz, p_queued_at timestamptz, p_at timestamptz)
RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint'`

// orderDB is a database of 2,000 verified domains of 200 tenants, and its queue.
type orderDB struct {
	pool *pgxpool.Pool
	q    *queue.Queue
}

func newOrderDB(b *testing.B, stub bool) orderDB {
	ctx := context.Background()
	pool, _ := pgtest.NewPool(b)
	for _, sql := range []string{
		`ALTER DATABASE ` + quoteDB(b, pool) + ` SET track_functions = 'pl'`,
		`INSERT INTO proxy_tenants (name, slug, email) SELECT 't' || g, 't' || g, 't@x' FROM generate_series(1, 200) g`,
		`INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
         SELECT t.id, 'd' || k || '.' || t.slug || '.example', 'verified', 'tok', 'pending', 'acme'
         FROM proxy_tenants t, generate_series(1, 10) k`,
		`VACUUM ANALYZE proxy_domains`,
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(b, err, sql)
	}
	if stub {
		_, err := pool.Exec(ctx, stubEventsSQL)
		require.NoError(b, err)
	}
	pool.Reset() // new sessions, with track_functions
	return orderDB{pool: pool, q: queue.New(pool, issuing.DefaultConfig())}
}

func quoteDB(b *testing.B, pool *pgxpool.Pool) string {
	var name string
	require.NoError(b, pool.QueryRow(context.Background(), `SELECT quote_ident(current_database())`).Scan(&name))
	return name
}

// order claims one domain as a wake-up's pass does (ClaimInLine) and stores its
// certificate (MarkActive), returning each statement's time from this client.
func (o orderDB) order(b *testing.B, cert *issuing.Certificate) (claim, store time.Duration) {
	ctx := context.Background()
	t0 := time.Now()
	claims, err := o.q.ClaimInLine(ctx, "bench", "https://ca.invalid/directory", 1, 0)
	claim = time.Since(t0)
	require.NoError(b, err)
	require.Len(b, claims, 1)
	t0 = time.Now()
	_, err = o.q.MarkActive(ctx, claims[0], cert)
	store = time.Since(t0)
	require.NoError(b, err)
	return claim, store
}

// BenchmarkEventsPerOrder measures the database time the domain's history adds to an
// order: 2,000 orders (a claim, then the certificate stored: the verified, claimed and
// issued events, and a notification) on a database that writes events and on one
// whose event functions write nothing, one order of each in turn. It writes
// bench/domain-events.txt.
func BenchmarkEventsPerOrder(b *testing.B) {
	ctx := context.Background()
	with, without := newOrderDB(b, false), newOrderDB(b, true)
	now := time.Now().Truncate(time.Second)
	cert := &issuing.Certificate{ChainPEM: strings.Repeat("c", 3000), PrivateKey: strings.Repeat("k", 320),
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(90 * 24 * time.Hour), Issuer: "CN=bench", Serial: "01",
		RenewAt: now.Add(60 * 24 * time.Hour)}
	const orders = 2000
	var wc, ws, oc, os_ []time.Duration
	for b.Loop() {
		for range orders {
			c, s := with.order(b, cert)
			wc, ws = append(wc, c), append(ws, s)
			c, s = without.order(b, cert)
			oc, os_ = append(oc, c), append(os_, s)
		}
	}
	var events int
	require.NoError(b, with.pool.QueryRow(ctx, `SELECT count(*) FROM certworker_domain_events`).Scan(&events))
	require.Equal(b, 3*orders, events)
	// The functions' own time on the server: certworker_domain_claimed's self time and
	// certworker_domain_event's total (its calls from the claim included).
	_, err := with.pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
	require.NoError(b, err)
	time.Sleep(2 * time.Second)
	var fnCalls int
	var fnMS float64
	require.NoError(b, with.pool.QueryRow(ctx, `
SELECT COALESCE(sum(calls) FILTER (WHERE funcname = 'certworker_domain_event'), 0)::int,
       COALESCE(sum(CASE funcname WHEN 'certworker_domain_claimed' THEN self_time ELSE total_time END), 0)
FROM pg_stat_user_functions WHERE funcname IN ('certworker_domain_claimed', 'certworker_domain_event')`).Scan(&fnCalls, &fnMS))

	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	mean := func(d []time.Duration) float64 {
		var s time.Duration
		for _, x := range d {
			s += x
		}
		return ms(s) / float64(len(d))
	}
	pct := func(d []time.Duration, p int) float64 {
		s := slices.Clone(d)
		slices.Sort(s)
		return ms(s[(len(s)-1)*p/100])
	}
	var text strings.Builder
	fmt.Fprintf(&text, `# The database time a domain's history adds to an order (queue/events_bench_test.go):
# %d orders, each a claim as a wake-up's pass makes it (ClaimInLine, one domain) and
# the certificate stored (MarkActive), on a database of 2,000 verified domains of 200
# tenants that writes the events (verified, claimed, issued, and NOTIFY
# certworker_domain) and on one whose two event functions write nothing, one order of
# each in turn. Times are this client's, per statement, over loopback.
# Statements: the events add none; they are written by the claim's and the store's own
# statements (certworker_domain_claimed, certworker_domain_event in their RETURNING).
# %s, %s %s/%s, %d CPUs, load average %s when written, PostgreSQL image %s
# command: CERTWORKER_PG_IMAGE=%s go test -run '^$' -bench BenchmarkEventsPerOrder -benchtime 1x ./queue/

%-34s %10s %10s %10s
%-34s %10.3f %10.3f %10.3f
%-34s %10.3f %10.3f %10.3f
%-34s %10.3f %10.3f %10.3f
%-34s %10.3f %10.3f %10.3f
%-34s %10.3f %10.3f %10.3f
%-34s %10.3f %10.3f %10.3f

# The event functions' own time on the server (pg_stat_user_functions, track_functions
# = pl): %d calls of certworker_domain_event, %.3f ms in all, %.4f ms per order.
`, orders, time.Now().UTC().Format("2006-01-02T15:04Z"), runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(),
		loadAvg(), pgtest.Image(), pgtest.Image(),
		"ms per statement", "mean", "p50", "p99",
		"claim, with events", mean(wc), pct(wc, 50), pct(wc, 99),
		"claim, without", mean(oc), pct(oc, 50), pct(oc, 99),
		"store, with events", mean(ws), pct(ws, 50), pct(ws, 99),
		"store, without", mean(os_), pct(os_, 50), pct(os_, 99),
		"order (claim + store), with", mean(wc)+mean(ws), pct(sum(wc, ws), 50), pct(sum(wc, ws), 99),
		"order (claim + store), without", mean(oc)+mean(os_), pct(sum(oc, os_), 50), pct(sum(oc, os_), 99),
		fnCalls, fnMS, fnMS/orders)
	b.Log("\n" + text.String())
	require.NoError(b, os.WriteFile(filepath.Join("..", "bench", "domain-events.txt"), []byte(text.String()), 0o644))
}

func sum(a, b []time.Duration) []time.Duration {
	out := make([]time.Duration, len(a))
	for i := range a {
		out[i] = a[i] + b[i]
	}
	return out
}
