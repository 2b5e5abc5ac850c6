package listener

// The numbers behind --wake logical, measured side by side in one run on
// one server: how soon each wake source tells the worker that a domain is due, and
// what each costs the proxy's writes. `make bench` runs it with -benchtime 1x; it is
// one long measurement that ignores b.N, so ns/op is only the run's wall time. The
// tables go to ../bench/logical.txt (the repository's bench/), replaced on each run.

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// logicalBenchCommand is how bench/logical.txt was produced, written into it.
const logicalBenchCommand = `CERTWORKER_PG_IMAGE=certworker-postgres:15 go test -run '^$' -bench BenchmarkWakeModes -benchtime 1x -timeout 30m ./listener/   (make bench runs every benchmark over ./...)`

const (
	// latencyDomains verified one at a time: a p99 that rests on ten samples.
	latencyDomains = 1000
	// latencySpacing separates the verifications, each a transaction of its own,
	// so that every one is a wake-up of its own rather than one merged into the
	// previous.
	latencySpacing = 5 * time.Millisecond
	// writers and writesPerWriter are the proxy's write load: 16 connections, each
	// verifying domains in transactions of their own, one domain each.
	writers         = 16
	writesPerWriter = 500
	// rounds of the write benchmark, the three modes interleaved in each and their
	// order rotated from one round to the next, so that a disturbance of the host
	// (a checkpoint, another process) or a position in the round does not favour
	// one mode. The median is reported.
	rounds = 5
)

// benchServerSettings: wal_level=logical for every mode, so that the comparison is
// between wake sources on one server, not between WAL levels; fsync=on (the test
// servers run with fsync=off otherwise), because the cost of NOTIFY's lock is that
// it is held across the commit's WAL flush, which fsync=off makes nearly free; and
// autovacuum=off, so that the vacuum of one run's 8,000 updates does not land in
// the middle of another's (each run's database is dropped after it instead).
var benchServerSettings = []string{"wal_level=logical", "fsync=on", "autovacuum=off", "max_replication_slots=20", "max_wal_senders=20"}

func BenchmarkWakeModes(b *testing.B) {
	srv := pgtest.StartServer(b, benchServerSettings...)
	var version string
	{
		pool := benchPool(b, srv.NewDatabase(b), 2)
		if err := pool.QueryRow(context.Background(), "SHOW server_version").Scan(&version); err != nil {
			b.Fatal(err)
		}
	}

	var out strings.Builder
	fmt.Fprintf(&out, "# Wake sources: NOTIFY against logical replication (issue #5).\n")
	fmt.Fprintf(&out, "# command: %s\n", logicalBenchCommand)
	fmt.Fprintf(&out, "# when: %s; PostgreSQL %s in a container, started with %s; %d CPUs, GOMAXPROCS %d\n",
		time.Now().UTC().Format(time.RFC3339), version, strings.Join(benchServerSettings, " "), runtime.NumCPU(), runtime.GOMAXPROCS(0))
	fmt.Fprintf(&out, "# wal_level=logical for all modes: it costs WAL volume in every mode, including notify.\n")
	fmt.Fprintf(&out, "# host load average (1, 5, 15 min) at the start: %s; other work on the host moves the\n", loadAverage())
	fmt.Fprintf(&out, "# absolute numbers from round to round, which is why the modes are interleaved.\n\n")

	// 1. Wake latency.
	fmt.Fprintf(&out, "## 1. Wake latency: %d domains verified one at a time, own transactions, %s apart.\n", latencyDomains, latencySpacing)
	fmt.Fprintf(&out, "## From ssl_queued_at (clock_timestamp() in the trigger, inside the verifying transaction,\n")
	fmt.Fprintf(&out, "## so before its commit) to Wake.At (time.Now() when the waker hands the wake-up to the\n")
	fmt.Fprintf(&out, "## worker's channel). Same host, same clock: the server runs in a local container.\n\n")
	tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tn\tp50 ms\tp95 ms\tp99 ms\tmax ms\tmean ms\t")
	for _, mode := range []string{issuing.WakeNotify, issuing.WakeLogical} {
		lat := benchLatency(b, srv, mode)
		slices.Sort(lat)
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", mode, len(lat),
			ms(pct(lat, 50)), ms(pct(lat, 95)), ms(pct(lat, 99)), ms(lat[len(lat)-1]), ms(mean(lat)))
		b.ReportMetric(ms(pct(lat, 50)), mode+"-p50-ms")
		b.ReportMetric(ms(pct(lat, 99)), mode+"-p99-ms")
	}
	_ = tw.Flush()

	// 2. The proxy's write throughput.
	fmt.Fprintf(&out, "\n## 2. The proxy's write throughput: %d connections, each verifying %d domains in\n", writers, writesPerWriter)
	fmt.Fprintf(&out, "## transactions of their own (each makes one domain due), %d transactions per run.\n", writers*writesPerWriter)
	fmt.Fprintf(&out, "## notify: setting notify, trigger calls pg_notify, a Listener listening.\n")
	fmt.Fprintf(&out, "## logical: setting logical, trigger does not notify, a Logical waker streaming.\n")
	fmt.Fprintf(&out, "## none: setting logical and no waker: no pg_notify, no slot (the floor).\n")
	fmt.Fprintf(&out, "## %d rounds, the modes interleaved (order rotated each round); tx/s is the median round,\n", rounds)
	fmt.Fprintf(&out, "## rounds lists every round in order; WAL is bytes per transaction; wake-ups is what the\n")
	fmt.Fprintf(&out, "## worker's side received after merging (a reader that drains its channel at once);\n")
	fmt.Fprintf(&out, "## waiting on a lock is the mean number of the %d writers queued on a heavyweight lock\n", writers)
	fmt.Fprintf(&out, "## (pg_stat_activity sampled every 20 ms, all rounds): NOTIFY's commit lock is one.\n\n")
	modes := []string{issuing.WakeNotify, issuing.WakeLogical, "none"}
	results := map[string][]writeResult{}
	for round := range rounds {
		for i := range modes {
			mode := modes[(round+i)%len(modes)]
			results[mode] = append(results[mode], benchWrites(b, srv, mode))
		}
	}
	tw = tabwriter.NewWriter(&out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\ttransactions\ttx/s (median)\trounds tx/s\twaiting on a lock\tWAL B/tx\twake-ups\t")
	for _, mode := range modes {
		rs := results[mode]
		tps := make([]float64, len(rs))
		each := make([]string, len(rs))
		for i, r := range rs {
			tps[i] = r.tps()
			each[i] = fmt.Sprintf("%.0f", r.tps())
		}
		med := slices.Clone(tps)
		slices.Sort(med)
		r := rs[len(rs)/2]
		var waiting float64
		for _, r := range rs {
			waiting += r.lockWaiting
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%.1f of %d\t%d\t%d\t\n", mode, r.n, med[len(med)/2], strings.Join(each, " "),
			waiting/float64(len(rs)), writers, r.walBytes/int64(r.n), r.wakes)
		b.ReportMetric(med[len(med)/2], mode+"-tx/s")
	}
	_ = tw.Flush()

	fmt.Print("\n" + out.String())
	if err := os.MkdirAll(filepath.Join("..", "bench"), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("..", "bench", "logical.txt"), []byte(out.String()), 0o644); err != nil {
		b.Fatal(err)
	}
}

func benchPool(b *testing.B, dsn string, conns int32) *pgxpool.Pool {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// benchWaker starts the waker of mode on pool and consumes its start-up wake-up.
func benchWaker(b *testing.B, pool *pgxpool.Pool, mode string) Waker {
	b.Helper()
	var w Waker
	switch mode {
	case issuing.WakeNotify:
		w = New(pool, zap.NewNop(), Options{})
	case issuing.WakeLogical:
		w = NewLogical(pool, zap.NewNop(), Options{})
	default:
		return nil
	}
	if err := w.Start(context.Background()); err != nil {
		b.Fatalf("start %s waker: %v", mode, err)
	}
	b.Cleanup(w.Stop)
	select {
	case <-w.Wakes():
	case <-time.After(10 * time.Second):
		b.Fatalf("%s waker: no start-up wake-up", mode)
	}
	return w
}

// benchDomains inserts n unverified ACME domains and returns their ids.
func benchDomains(b *testing.B, pool *pgxpool.Pool, n int) []string {
	b.Helper()
	ctx := context.Background()
	var tenant string
	if err := pool.QueryRow(ctx,
		"INSERT INTO proxy_tenants (name, slug, email) VALUES ('bench', 'bench', 'bench@certworker.invalid') RETURNING id").Scan(&tenant); err != nil {
		b.Fatal(err)
	}
	rows, err := pool.Query(ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
SELECT $1, 'bench' || g || '.example', 'pending', 'tok', 'pending', 'acme' FROM generate_series(1, $2::int) g
RETURNING id::text`, tenant, n)
	if err != nil {
		b.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		b.Fatal(err)
	}
	// A clean start for what is measured: the inserts' dirty pages flushed.
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		b.Fatal(err)
	}
	return ids
}

// benchLatency verifies latencyDomains domains one at a time with mode's waker
// running and returns, for each, the time from its ssl_queued_at to the wake-up.
func benchLatency(b *testing.B, srv *pgtest.Server, mode string) []time.Duration {
	b.Helper()
	ctx := context.Background()
	pool := benchPool(b, srv.NewDatabase(b), 4)
	if _, err := setWakeMode(ctx, pool, mode); err != nil {
		b.Fatal(err)
	}
	ids := benchDomains(b, pool, latencyDomains)
	w := benchWaker(b, pool, mode)
	defer w.Stop()

	lat := make([]time.Duration, 0, len(ids))
	for _, id := range ids {
		var queued time.Time
		if err := pool.QueryRow(ctx,
			`UPDATE proxy_domains SET verification_status = 'verified' WHERE id = $1 RETURNING ssl_queued_at`, id).Scan(&queued); err != nil {
			b.Fatal(err)
		}
		select {
		case wk := <-w.Wakes():
			if wk.Source != SourceNotify {
				b.Fatalf("%s: wake-up from %s, want %s", mode, wk.Source, SourceNotify)
			}
			lat = append(lat, wk.At.Sub(queued))
		case <-time.After(10 * time.Second):
			b.Fatalf("%s: no wake-up within 10 s of a verification", mode)
		}
		time.Sleep(latencySpacing)
	}
	return lat
}

type writeResult struct {
	n        int
	elapsed  time.Duration
	walBytes int64
	wakes    int
	// lockWaiting is the mean number of writers waiting on a heavyweight lock.
	lockWaiting float64
}

func (r writeResult) tps() float64 { return float64(r.n) / r.elapsed.Seconds() }

// benchWrites runs the proxy's write load on a fresh database in mode ("none": the
// logical setting and no waker) and measures it.
func benchWrites(b *testing.B, srv *pgtest.Server, mode string) writeResult {
	b.Helper()
	ctx := context.Background()
	dsn := srv.NewDatabase(b)
	pool := benchPool(b, dsn, writers+2)
	defer dropDatabase(b, srv, dsn)
	setting := issuing.WakeLogical
	if mode == issuing.WakeNotify {
		setting = issuing.WakeNotify
	}
	if _, err := setWakeMode(ctx, pool, setting); err != nil {
		b.Fatal(err)
	}
	ids := benchDomains(b, pool, writers*writesPerWriter)

	// The worker's side: a waker whose wake-ups are read as fast as they come.
	var wakes int
	var drained sync.WaitGroup
	stop := make(chan struct{})
	if w := benchWaker(b, pool, mode); w != nil {
		defer w.Stop()
		drained.Go(func() {
			for {
				select {
				case <-w.Wakes():
					wakes++
				case <-stop:
					return
				}
			}
		})
	}

	conns := make([]*pgxpool.Conn, writers)
	for i := range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		conns[i] = c
	}
	var lsn0 string
	if err := conns[0].QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn0); err != nil {
		b.Fatal(err)
	}

	// How many of the writers are queued on a heavyweight lock, sampled through
	// the run: NOTIFY's commit lock shows here (wait_event 'object'); the rows
	// themselves are distinct, so nothing else should.
	var lockWaits, samples int
	sampleStop := make(chan struct{})
	var sampled sync.WaitGroup
	sampler, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	sampled.Go(func() {
		defer sampler.Release()
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-sampleStop:
				return
			case <-t.C:
			}
			var n int
			if err := sampler.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err == nil {
				lockWaits += n
				samples++
			}
		}
	})

	errs := make(chan error, writers)
	var wg sync.WaitGroup
	began := time.Now()
	for i, c := range conns {
		mine := ids[i*writesPerWriter : (i+1)*writesPerWriter]
		wg.Go(func() {
			for _, id := range mine {
				if _, err := c.Exec(ctx, `UPDATE proxy_domains SET verification_status = 'verified' WHERE id = $1`, id); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(began)
	close(sampleStop)
	sampled.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}

	var wal int64
	if err := conns[0].QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint", lsn0).Scan(&wal); err != nil {
		b.Fatal(err)
	}
	for _, c := range conns {
		c.Release()
	}
	// Let the waker catch up before the count is read.
	time.Sleep(500 * time.Millisecond)
	close(stop)
	drained.Wait()
	pool.Close()
	return writeResult{n: len(ids), elapsed: elapsed, walBytes: wal, wakes: wakes,
		lockWaiting: float64(lockWaits) / float64(max(samples, 1))}
}

// dropDatabase drops the database of dsn at once, rather than when the benchmark
// ends, so that the next run shares the server with nothing but its own.
func dropDatabase(b *testing.B, srv *pgtest.Server, dsn string) {
	b.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		b.Fatal(err)
	}
	conn, err := pgx.Connect(context.Background(), srv.AdminURL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(),
		"DROP DATABASE IF EXISTS "+pgx.Identifier{strings.TrimPrefix(u.Path, "/")}.Sanitize()+" WITH (FORCE)"); err != nil {
		b.Fatal(err)
	}
}

func pct(sorted []time.Duration, p int) time.Duration {
	i := (len(sorted)*p + 99) / 100
	return sorted[max(0, min(len(sorted)-1, i-1))]
}

func mean(d []time.Duration) time.Duration {
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return sum / time.Duration(len(d))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// loadAverage is the host's load average where /proc says it, "unknown" elsewhere.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}

// setWakeMode records the wake mode as `certworker run` does.
func setWakeMode(ctx context.Context, pool *pgxpool.Pool, mode string) (string, error) {
	return queue.New(pool, issuing.DefaultConfig()).SetWakeMode(ctx, mode)
}
