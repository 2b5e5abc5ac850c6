package queue_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// A new session of the worker's pool has the wake path's statements prepared and
// planned before anyone uses it: the claims a wake-up's pass then runs on it (the newcomers' slot,
// then the rest) are executed on the plan the server settled on during the warm-up,
// and plan nothing themselves. Without the warm-up the claim is prepared by its
// first use, and its first five executions are each planned (custom_plans 2 here).
func TestWarmUp_TheWakePathsClaimRunsOnTheWarmUpsPlan(t *testing.T) {
	ctx := context.Background()
	cfg := issuing.DefaultConfig()
	conn := warmedConn(t, cfg)

	plans := func() (n, custom, generic int64) {
		t.Helper()
		if err := conn.QueryRow(ctx, `SELECT count(*), COALESCE(sum(custom_plans), 0), COALESCE(sum(generic_plans), 0)
FROM pg_prepared_statements WHERE statement = $1`, queue.ClaimSQLForTest).Scan(&n, &custom, &generic); err != nil {
			t.Fatal(err)
		}
		return n, custom, generic
	}
	if n, custom, generic := plans(); n != 1 || custom != 5 || generic != 1 {
		t.Fatalf("after the warm-up: %d claim statements prepared, %d custom and %d generic plans; want 1, 5 and 1", n, custom, generic)
	}
	// The next due time and the store are prepared and planned too: every statement
	// of the warm-up's, under pgx's statement cache names, planned five times with
	// their arguments (and a sixth time, generic, where the server prefers it).
	var warmed int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements
WHERE name LIKE 'stmtcache\_%' AND custom_plans = 5 AND generic_plans <= 1
  AND (statement = $1 OR statement LIKE '% per_count AS (%' OR statement LIKE '%INSERT INTO proxy_certificates%')`,
		queue.ClaimSQLForTest).Scan(&warmed); err != nil {
		t.Fatal(err)
	}
	if warmed != 3 {
		t.Fatalf("%d of the claim, the next due time and the store prepared and planned by the warm-up; want 3", warmed)
	}
	claims, err := queue.New(conn.Conn(), cfg).ClaimInLine(ctx, "w1", warmDirectory, 4, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(claims) != 0 {
		t.Fatalf("claimed %d rows of a queue with nothing due", len(claims))
	}
	if n, custom, generic := plans(); n != 1 || custom != 5 || generic != 3 {
		t.Fatalf("after a pass's two claims: %d claim statements prepared, %d custom and %d generic plans; want 1, 5 and 3 (the warm-up's statement, run on its generic plan twice)", n, custom, generic)
	}
}

// The return of held rows, which runs before the claim on the timer's passes and on a
// refill's once a second while a wake-up may be waiting for the loop, is planned by
// the warm-up, once, and never again: it has no parameters, so the server keeps the
// one plan. With its settings as parameters the server planned it anew at every call
// (custom plans: it never preferred the generic one), 10-28 ms each in the wake
// benchmark, while the notification that came meanwhile waited.
func TestWarmUp_TheReturnOfHeldRowsIsPlannedOnceNotAtEveryCall(t *testing.T) {
	ctx := context.Background()
	cfg := issuing.DefaultConfig()
	conn := warmedConn(t, cfg)
	q := queue.New(conn.Conn(), cfg)
	plans := func() (n, custom, generic int64) {
		t.Helper()
		if err := conn.QueryRow(ctx, `SELECT count(*), COALESCE(sum(custom_plans), 0), COALESCE(sum(generic_plans), 0)
FROM pg_prepared_statements WHERE statement = $1`, queue.ReturnHeldSQLForTest(q, warmDirectory)).Scan(&n, &custom, &generic); err != nil {
			t.Fatal(err)
		}
		return n, custom, generic
	}
	if n, custom, generic := plans(); n != 1 || custom != 0 || generic != 1 {
		t.Fatalf("after the warm-up: %d statements returning held rows prepared, %d custom and %d generic plans; want 1, 0 and 1", n, custom, generic)
	}
	for range 7 {
		if returned, err := q.ReturnHeld(ctx, warmDirectory); err != nil || returned != 0 {
			t.Fatalf("return held rows of a table that holds none: %d, %v", returned, err)
		}
	}
	if n, custom, generic := plans(); n != 1 || custom != 0 || generic != 8 {
		t.Fatalf("after seven returns: %d statements prepared, %d custom and %d generic plans; want 1, 0 and 8 (the warm-up's one plan, used each time)", n, custom, generic)
	}
}

// warmDirectory is the CA the warm-up tests' sessions are warmed up for.
const warmDirectory = "https://ca.invalid/directory"

// warmedConn is a session of the worker's pool, warmed up, on the wake benchmark's
// table.
func warmedConn(t *testing.T, cfg issuing.Config) *pgxpool.Conn {
	t.Helper()
	ctx := context.Background()
	pool, err := queue.NewPoolWith(ctx, wakeBenchTable(t), queue.WorkerSessionFor(cfg, warmDirectory))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	return conn
}

// BenchmarkWarmUp is what warming a new connection up costs (Queue.WarmUp on a
// session that has run nothing yet, its catalog caches cold), beside making the
// connection alone: the price of each connection the worker's pool makes, paid in
// the background.
func BenchmarkWarmUp(b *testing.B) {
	ctx := context.Background()
	dsn := wakeBenchTable(b)
	q := queue.New(nil, issuing.DefaultConfig())
	for _, warm := range []bool{false, true} {
		b.Run(map[bool]string{false: "connect", true: "connect-and-warm-up"}[warm], func(b *testing.B) {
			for b.Loop() {
				conn, err := pgx.Connect(ctx, dsn)
				if err != nil {
					b.Fatal(err)
				}
				if warm {
					if err := q.WarmUp(ctx, conn, "https://ca.invalid/directory"); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				_ = conn.Close(ctx)
				b.StartTimer()
			}
		})
	}
}

// wakeBenchTable is a database with the wake benchmark's table: 1,000 rows, analysed,
// none due. It returns its URL.
func wakeBenchTable(tb testing.TB) string {
	tb.Helper()
	ctx := context.Background()
	seed, dsn := pgtest.NewPool(tb)
	if _, err := seed.Exec(ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
SELECT $1, 'warm' || g || '.example', 'pending', 'tok', 'pending', 'acme' FROM generate_series(1, 1000) g`,
		pgtest.Tenant(tb, seed)); err != nil {
		tb.Fatal(err)
	}
	if _, err := seed.Exec(ctx, `VACUUM ANALYZE proxy_domains, proxy_certificates`); err != nil {
		tb.Fatal(err)
	}
	return dsn
}
