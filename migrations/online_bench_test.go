package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/certworker/certworker/internal/legacydb"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/migrations"
)

// BenchmarkUp_UnderProxyWrites measures what migrate costs the proxy (issue #10): the
// proxy's database as the reference left it (100,000 domains) is migrated from
// scratch while a writer updates random proxy_domains rows 200 times a second, each
// write in its own transaction, from before the migration starts until after it
// ends. In some runs one of the proxy's transactions also holds a row lock on
// proxy_domains for 8 s: from the moment migrate starts (the first concurrent index
// build waits for it), or from the moment 00004 is recorded, so that it is held when
// 00005 asks for the ACCESS EXCLUSIVE lock of its ALTER TABLE; while that request
// waits, every write to the table queues behind it. The last run is the same with the
// lock timeout off, as migrate ran before: the writes queue for as long as the
// proxy's transaction lasts.
//
// Reported: the migration's wall time, the writes and their errors, the writes'
// latency (the statement alone, and from the moment it was due, which adds the wait
// for a free connection of the writer's pool when earlier writes are stuck), and how
// many times a statement gave up waiting and was retried. A run fails when a write
// failed or took longer than the lock timeout plus 100 ms.
//
// Each run appends a line per case to bench/migrate.txt.
//
//	go test -run '^$' -bench BenchmarkUp_UnderProxyWrites -benchtime 1x ./migrations/
func BenchmarkUp_UnderProxyWrites(b *testing.B) {
	for _, tc := range []struct {
		name        string
		lockTimeout time.Duration
		holdFrom    int64 // -1: no held lock; 0: from the start; n: once migration n is recorded
	}{
		{"writes", migrations.DefaultLockTimeout, -1},
		{"writes+8s_row_lock_from_start", migrations.DefaultLockTimeout, 0},
		{"writes+8s_row_lock_before_00005", migrations.DefaultLockTimeout, 4},
		{"writes+8s_row_lock_before_00005+lock_timeout_off", migrations.NoLockTimeout, 4},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				r := measureMigration(b, tc.lockTimeout, tc.holdFrom)
				r.report(b)
				r.record(b, tc.name)
				if tc.lockTimeout > 0 {
					if r.errors > 0 {
						b.Errorf("%d writes failed", r.errors)
					}
					if limit := tc.lockTimeout + 100*time.Millisecond; r.maxExec > limit {
						b.Errorf("a write took %s, more than the lock timeout plus 100 ms (%s)", r.maxExec, limit)
					}
				}
			}
		})
	}
}

// writerConns is the writer's pool: the proxy's, sqlx's default of 10 connections (the
// reference's tests connect with PgPool::connect). CERTWORKER_BENCH_WRITER_CONNS sets
// another: with 100, a hundred writes are stuck behind a waiting DDL at once and are
// released together, which on two cores takes longer to drain.
var writerConns = func() int {
	if n, err := strconv.Atoi(os.Getenv("CERTWORKER_BENCH_WRITER_CONNS")); err == nil && n > 0 {
		return n
	}
	return 10
}()

const (
	writesPerSecond = 200
	heldFor         = 8 * time.Second
)

type migrationRun struct {
	migrate          time.Duration
	writes, errors   int
	exec, sinceDue   []time.Duration
	maxExec, maxDue  time.Duration
	retries          int
	heldAt, heldDone time.Duration
}

func measureMigration(b *testing.B, lockTimeout time.Duration, holdFrom int64) *migrationRun {
	b.Helper()
	ctx := context.Background()
	url := legacydb.New(b, pgtest.Shared(b), legacydb.Options{})
	w := startWriter(b, url)
	time.Sleep(500 * time.Millisecond) // the writer's pool warm, its rate steady
	r := &migrationRun{}
	start := time.Now()
	held := make(chan struct{})
	if holdFrom >= 0 {
		go holdRowLock(b, url, holdFrom, start, r, held)
	} else {
		close(held)
	}
	var retries atomic.Int64
	db := openDB(b, url)
	_, err := migrations.Up(ctx, db, migrations.Options{
		LockTimeout: lockTimeout,
		OnRetry:     func(migrations.Retry) { retries.Add(1) },
	})
	r.migrate = time.Since(start)
	if err != nil {
		b.Fatalf("migrate: %v", err)
	}
	<-held
	time.Sleep(500 * time.Millisecond)
	w.stop(r)
	r.retries = int(retries.Load())
	return r
}

// holdRowLock is one of the proxy's transactions: it updates one row (the writer never
// touches it) and holds its lock for 8 s, starting when migration holdFrom has been
// recorded (0: at once).
func holdRowLock(b *testing.B, url string, holdFrom int64, start time.Time, r *migrationRun, done chan<- struct{}) {
	defer close(done)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Errorf("hold: %v", err)
		return
	}
	defer conn.Close(ctx)
	for holdFrom > 0 {
		var v *int64
		err := conn.QueryRow(ctx, `SELECT CASE WHEN to_regclass('goose_db_version') IS NOT NULL
            THEN (SELECT max(version_id) FROM goose_db_version) END`).Scan(&v)
		if err != nil {
			// goose creates its table while this looks: try again.
			v = nil
		}
		if v != nil && *v >= holdFrom {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		b.Errorf("hold: %v", err)
		return
	}
	if _, err := tx.Exec(ctx, `UPDATE proxy_domains SET updated_at = now() WHERE id = $1`, legacydb.DomainID(1)); err != nil {
		b.Errorf("hold: %v", err)
		return
	}
	r.heldAt = time.Since(start)
	time.Sleep(heldFor)
	if err := tx.Commit(ctx); err != nil {
		b.Errorf("hold: %v", err)
	}
	r.heldDone = time.Since(start)
}

// writer updates a random row of proxy_domains writesPerSecond times a second, each
// write in its own transaction on a connection of its pool, whether or not the
// previous ones have finished (as the proxy's requests do).
type writer struct {
	pool *pgxpool.Pool
	quit chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	exec []time.Duration
	due  []time.Duration
	errs int
}

func startWriter(b *testing.B, url string) *writer {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = int32(writerConns)
	cfg.MinConns = int32(writerConns)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	w := &writer{pool: pool, quit: make(chan struct{})}
	w.wg.Go(w.loop)
	return w
}

func (w *writer) loop() {
	interval := time.Second / writesPerSecond
	next := time.Now()
	for {
		next = next.Add(interval)
		select {
		case <-w.quit:
			return
		case <-time.After(time.Until(next)):
		}
		due := next
		w.wg.Go(func() { w.write(due) })
	}
}

func (w *writer) write(due time.Time) {
	ctx := context.Background()
	conn, err := w.pool.Acquire(ctx)
	if err != nil {
		w.record(0, 0, err)
		return
	}
	defer conn.Release()
	// Row 1 is the held transaction's; the writer's rows are the others.
	id := legacydb.DomainID(2 + rand.IntN(99_999))
	start := time.Now()
	_, err = conn.Exec(ctx, `UPDATE proxy_domains SET updated_at = now() WHERE id = $1`, id)
	end := time.Now()
	w.record(end.Sub(start), end.Sub(due), err)
}

func (w *writer) record(exec, sinceDue time.Duration, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.errs++
		return
	}
	w.exec = append(w.exec, exec)
	w.due = append(w.due, sinceDue)
}

func (w *writer) stop(r *migrationRun) {
	close(w.quit)
	w.wg.Wait()
	w.pool.Close()
	r.exec, r.sinceDue, r.errors = w.exec, w.due, w.errs
	r.writes = len(w.exec) + w.errs
	r.maxExec, r.maxDue = slices.Max(w.exec), slices.Max(w.due)
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func (r *migrationRun) report(b *testing.B) {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(r.migrate.Seconds(), "migrate_s")
	b.ReportMetric(float64(r.writes), "writes")
	b.ReportMetric(float64(r.errors), "write_errors")
	b.ReportMetric(ms(percentile(r.exec, 0.5)), "p50_write_ms")
	b.ReportMetric(ms(percentile(r.exec, 0.99)), "p99_write_ms")
	b.ReportMetric(ms(r.maxExec), "max_write_ms")
	b.ReportMetric(ms(r.maxDue), "max_since_due_ms")
	b.ReportMetric(float64(r.retries), "retries")
	b.ReportMetric(0, "ns/op")
	held := "no lock held"
	if r.heldDone > 0 {
		held = fmt.Sprintf("8 s row lock held from %.1fs to %.1fs", r.heldAt.Seconds(), r.heldDone.Seconds())
	}
	b.Logf("migrate %.1fs, %s; %d writes (%d failed), statement p50 %.1f ms, p99 %.1f ms, max %.1f ms; max since due %.1f ms; %d retries",
		r.migrate.Seconds(), held, r.writes, r.errors, ms(percentile(r.exec, 0.5)), ms(percentile(r.exec, 0.99)),
		ms(r.maxExec), ms(r.maxDue), r.retries)
}

// migrateBenchCommand is how bench/migrate.txt was produced, written into it.
const migrateBenchCommand = `CERTWORKER_PG_IMAGE=certworker-postgres:15 TESTCONTAINERS_RYUK_DISABLED=true go test -run '^$' -bench BenchmarkUp_UnderProxyWrites -benchtime 1x -timeout 30m ./migrations/`

// record appends the run to ../bench/migrate.txt (the repository's bench/), with a
// header when the file is new, and the machine's load: a shared host is noted.
func (r *migrationRun) record(b *testing.B, name string) {
	b.Helper()
	path := filepath.Join("..", "bench", "migrate.txt")
	var text string
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		text = fmt.Sprintf("# migrate on the proxy's database (100,000 domains, never migrated) while a writer updates\n"+
			"# proxy_domains %d times a second (each write its own transaction; its pool's size ends each line);\n"+
			"# write latency is the statement's, and from when it was due (adds the wait for a pooled connection).\n"+
			"# One line per case, appended on every run.\n# command: %s\n"+
			"# %-22s %-50s %8s %6s %6s %8s %8s %8s %9s %7s %s\n", writesPerSecond, migrateBenchCommand,
			"when (UTC)", "case", "migrate", "writes", "errors", "p50 ms", "p99 ms", "max ms", "max due", "retries", "load, pool")
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	text += fmt.Sprintf("%-24s %-50s %7.1fs %6d %6d %8.1f %8.1f %8.1f %9.1f %7d %s, pool %d\n",
		time.Now().UTC().Format(time.RFC3339), name, r.migrate.Seconds(), r.writes, r.errors,
		ms(percentile(r.exec, 0.5)), ms(percentile(r.exec, 0.99)), ms(r.maxExec), ms(r.maxDue), r.retries,
		loadAvg(), writerConns)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		b.Fatalf("results file: %v", err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		b.Fatalf("results file: %v", err)
	}
}

// loadAvg is the host's one-minute load average, or "?" off Linux.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "load ?"
	}
	if f := strings.Fields(string(data)); len(f) > 0 {
		return "load " + f[0]
	}
	return "load ?"
}
