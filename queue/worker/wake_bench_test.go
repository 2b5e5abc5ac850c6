package worker_test

// The wake-latency benchmark: a tenant's "verify" to the claim of that domain.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// The wake-latency runs. 1,000 verifications give a p99 that rests on ten samples.
const (
	wakeDomains = 1000
	wakeRuns    = 3
	// benchPollInterval is the reference's POLL_INTERVAL, and --poll-interval for the
	// worker under test, so that only NOTIFY can explain a claim inside it.
	benchPollInterval = 30 * time.Second
	// pollSpacing spreads the 1,000 verifications over exactly one poll period, so
	// that their offsets from the poll are uniform, as a tenant's clicks are.
	pollSpacing = benchPollInterval / wakeDomains
)

// notifySpacings separate the verifications for the NOTIFY runs: each is a transaction
// of its own and a wake-up of its own, not a burst that one pass drains. 10 ms (100 a
// second) is a busy proxy; 50 ms leaves the worker idle between verifications, which
// is the wake latency proper.
var notifySpacings = []time.Duration{50 * time.Millisecond, 10 * time.Millisecond}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// referenceLoop is the reference worker's run loop (reference/ssl.rs, run and tick),
// over this package's statements: sleep the poll interval, then reclaim, mark
// renewals, and claim, issue and record one domain at a time until nothing is due. No
// listener, no timer, one order at a time. It stops when the benchmark ends.
func referenceLoop(tb testing.TB, q *queue.Queue, issuer issuing.Issuer, poll time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	tick := func() error {
		if _, err := q.ReclaimAbandoned(ctx); err != nil {
			return err
		}
		if _, err := q.MarkRenewals(ctx); err != nil {
			return err
		}
		for {
			claims, err := q.Claim(ctx, "reference", workertest.Directory, 1)
			if err != nil || len(claims) == 0 {
				return err
			}
			c := claims[0]
			cert, err := issuer.Issue(ctx, issuing.Request{DomainID: c.ID, Domain: c.Domain, CurrentPEM: c.CurrentPEM})
			if err != nil {
				return fmt.Errorf("issue %s: %w", c.Domain, err)
			}
			if _, err := q.MarkActive(ctx, c, cert); err != nil {
				return err
			}
		}
	}
	go func() {
		defer close(done)
		t := time.NewTimer(poll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := tick(); err != nil && !errors.Is(err, context.Canceled) {
				tb.Errorf("reference tick: %v", err)
			}
			t.Reset(poll)
		}
	}()
	tb.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(time.Minute):
			tb.Error("the reference loop did not stop within a minute")
		}
	})
}

// verifyOneByOne verifies the domains as a tenant would, one UPDATE (one committed
// transaction, one NOTIFY) each, the ith at start + i*spacing. It returns the
// verifying transactions' ids, in the order of ids, for commitLatency.
func (d *benchDB) verifyOneByOne(tb testing.TB, ids []string, start time.Time, spacing time.Duration) []string {
	tb.Helper()
	xids := make([]string, len(ids))
	for i, id := range ids {
		time.Sleep(time.Until(start.Add(time.Duration(i) * spacing)))
		if err := d.pool.QueryRow(d.ctx, `UPDATE proxy_domains SET verification_status = 'verified' WHERE id = $1
RETURNING xmin::text`, id).Scan(&xids[i]); err != nil {
			tb.Fatalf("verify %s: %v", id, err)
		}
	}
	return xids
}

// latency is the wake latency distribution of one run, in milliseconds.
type latency struct {
	mode                string
	n                   int
	p50, p95, p99, max  float64
	min, mean           float64
	spacing, pollPeriod time.Duration
	// load is the host's one-minute load average at the end of the run.
	load string
	note string
	// commit is the same run measured from each verify's commit (commitLatency),
	// when the server records commit timestamps.
	commit *latency
}

// wakeLatency reads the distribution from the database, so both ends are on the
// server's clock: ssl_queued_at, which the trigger sets to clock_timestamp() inside
// the verifying UPDATE (a fraction of a millisecond before that transaction commits,
// and its NOTIFY goes out), to ssl_last_attempt_at, which the claim sets to the
// clock as it writes the row (after its snapshot) and which nothing after the claim
// changes (MarkActive leaves it).
func (d *benchDB) wakeLatency(tb testing.TB) latency {
	tb.Helper()
	return d.distribution(tb, `
    SELECT extract(epoch FROM ssl_last_attempt_at - ssl_queued_at)::float8 * 1000 AS ms
    FROM proxy_domains
    WHERE ssl_status = 'active' AND ssl_queued_at IS NOT NULL AND ssl_last_attempt_at IS NOT NULL`)
}

// distribution is the distribution of the latencies, in ms, that the query samples
// (one column, ms) returns.
func (d *benchDB) distribution(tb testing.TB, samples string, args ...any) latency {
	tb.Helper()
	var l latency
	var p []float64
	if err := d.pool.QueryRow(d.ctx, `
WITH w AS (`+samples+`)
SELECT count(*), percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY ms),
       max(ms), min(ms), avg(ms)
FROM w`, args...).Scan(&l.n, &p, &l.max, &l.min, &l.mean); err != nil {
		tb.Fatalf("read wake latencies: %v", err)
	}
	l.p50, l.p95, l.p99 = p[0], p[1], p[2]
	return l
}

// commitLatency is the wake latency measured from each verify's commit, as the issue
// that set the target measured it: the commit timestamp of the verifying transaction
// (pg_xact_commit_timestamp of the xids verifyOneByOne returns, with
// track_commit_timestamp on) to the claim's now(). The commit timestamp is taken as
// the commit record is written, before the transaction becomes visible and its
// NOTIFY goes out. ssl_queued_at, the other ruler, is stamped earlier, by the wake
// trigger, before the rest of the verify (the update of the row and its indexes, the
// other triggers, the commit): time the proxy's own transaction spends. It returns
// nil where the server does not record commit timestamps.
func (d *benchDB) commitLatency(tb testing.TB, ids, xids []string) *latency {
	tb.Helper()
	var on string
	if err := d.pool.QueryRow(d.ctx, `SHOW track_commit_timestamp`).Scan(&on); err != nil || on != "on" {
		return nil
	}
	l := d.distribution(tb, `
    SELECT extract(epoch FROM d.ssl_last_attempt_at - pg_xact_commit_timestamp(v.x::xid))::float8 * 1000 AS ms
    FROM unnest($1::uuid[], $2::text[]) AS v(id, x)
    JOIN proxy_domains d ON d.id = v.id
    WHERE d.ssl_status = 'active' AND d.ssl_last_attempt_at IS NOT NULL`, ids, xids)
	return &l
}

func (l latency) report(b *testing.B) {
	b.ReportMetric(l.p50, "p50-ms")
	b.ReportMetric(l.p95, "p95-ms")
	b.ReportMetric(l.p99, "p99-ms")
	b.ReportMetric(l.max, "max-ms")
	b.ReportMetric(float64(l.n), "domains")
}

// BenchmarkWakeLatency measures a tenant's "verify" to the claim, for this worker
// (NOTIFY, with a 30 s poll as the safety net only), three runs in a row at each
// spacing, and for the reference's loop (a 30 s poll and nothing else), and writes
// them to bench/wake-latency.txt.
func BenchmarkWakeLatency(b *testing.B) {
	var results []latency
	for _, spacing := range notifySpacings {
		for run := 1; run <= wakeRuns; run++ {
			b.Run(fmt.Sprintf("notify/spacing-%s/run-%d", spacing, run), func(b *testing.B) {
				d := newBenchDB(b)
				ids := d.insertDomains(b, wakeDomains, "pending")
				fake := fakeissuer.New(1)
				in := workertest.Start(b, d.dsn, "bench", worker.Config{Issuer: fake, Concurrency: 4, PollInterval: benchPollInterval})
				// The wake source's first connection wakes the worker; that pass finds nothing.
				in.WaitForLog(b, "pass finished", 1, 30*time.Second)
				b.ResetTimer()
				xids := d.verifyOneByOne(b, ids, time.Now(), spacing)
				d.waitActive(b, wakeDomains, 2*time.Minute, 50*time.Millisecond)
				b.StopTimer()
				l := d.wakeLatency(b)
				l.commit = d.commitLatency(b, ids, xids)
				l.mode, l.spacing, l.pollPeriod, l.load = fmt.Sprintf("notify run %d", run), spacing, benchPollInterval, loadAvg()
				l.note = fmt.Sprintf("%s; %s; %s", claimSources(b, in), notifyBreakdown(b, d, in), d.windowMaxima(b, 5*time.Second))
				checkIssuedOnce(b, fake, wakeDomains)
				l.report(b)
				b.Log(l.note)
				results = append(results, l)
			})
		}
	}
	for _, spacing := range notifySpacings {
		b.Run(fmt.Sprintf("floor/spacing-%s", spacing), func(b *testing.B) {
			d := newBenchDB(b)
			b.ResetTimer()
			l := d.notifyFloor(b, wakeDomains, spacing)
			b.StopTimer()
			l.report(b)
			results = append(results, l)
		})
	}
	b.Run("poll-only", func(b *testing.B) {
		d := newBenchDB(b)
		ids := d.insertDomains(b, wakeDomains, "pending")
		fake := fakeissuer.New(1)
		b.ResetTimer()
		start := time.Now()
		referenceLoop(b, queue.New(d.pool, issuing.DefaultConfig()), fake, benchPollInterval)
		d.verifyOneByOne(b, ids, start, pollSpacing)
		d.waitActive(b, wakeDomains, 3*benchPollInterval, 200*time.Millisecond)
		b.StopTimer()
		l := d.wakeLatency(b)
		l.mode, l.spacing, l.pollPeriod, l.load = "poll-only", pollSpacing, benchPollInterval, loadAvg()
		l.note = "the reference's loop: sleep 30 s, then claim, issue and record one at a time until empty"
		checkIssuedOnce(b, fake, wakeDomains)
		l.report(b)
		results = append(results, l)
	})
	if len(results) > 0 {
		writeWakeLatency(b, results)
	}
}

// notifyFloor is what the rig itself costs a wake-up, with no certworker in it: n
// NOTIFYs, each a committed transaction of its own, spacing apart, carrying their
// clock_timestamp(); a connection LISTENing for them; and on each, one query on a
// third, idle connection, whose now() ends the sample, as the claim's now() ends a
// verify's. Delivery, two wake-ups of idle processes and one round trip: the least
// any worker fed by LISTEN/NOTIFY can take on this machine. What the notify runs take
// beyond it is certworker's (its triggers, its commit, its pass).
func (d *benchDB) notifyFloor(tb testing.TB, n int, spacing time.Duration) latency {
	tb.Helper()
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(d.ctx, d.dsn)
		if err != nil {
			tb.Fatalf("floor: connect: %v", err)
		}
		tb.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	sender, listen, query := connect(), connect(), connect()
	if _, err := listen.Exec(d.ctx, "LISTEN certworker_bench_floor"); err != nil {
		tb.Fatalf("floor: listen: %v", err)
	}
	samples := make(chan float64, n)
	errs := make(chan error, 1)
	go func() {
		for range n {
			note, err := listen.WaitForNotification(d.ctx)
			if err != nil {
				errs <- err
				return
			}
			var v float64
			if err := query.QueryRow(d.ctx, `SELECT extract(epoch FROM now() - $1::timestamptz)::float8 * 1000`, note.Payload).Scan(&v); err != nil {
				errs <- err
				return
			}
			samples <- v
		}
	}()
	start := time.Now()
	var xs []float64
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * spacing)))
		if _, err := sender.Exec(d.ctx, `SELECT pg_notify('certworker_bench_floor', clock_timestamp()::text)`); err != nil {
			tb.Fatalf("floor: notify: %v", err)
		}
		select {
		case v := <-samples:
			xs = append(xs, v)
		case err := <-errs:
			tb.Fatalf("floor: %v", err)
		case <-time.After(10 * time.Second):
			tb.Fatalf("floor: notification %d did not arrive within 10 s", i)
		}
	}
	slices.Sort(xs)
	at := func(f float64) float64 { return xs[min(int(f*float64(len(xs))), len(xs)-1)] }
	var sum float64
	for _, v := range xs {
		sum += v
	}
	return latency{mode: "rig floor", n: len(xs), p50: at(0.5), p95: at(0.95), p99: at(0.99), max: xs[len(xs)-1], min: xs[0],
		mean: sum / float64(len(xs)), spacing: spacing, pollPeriod: 0, load: loadAvg(),
		note: "NOTIFY to a query on another idle connection, no certworker: delivery, two wake-ups and a round trip"}
}

// notifyBreakdown splits each domain's wake latency at the events the listener and
// the worker log: the listener receiving the notification of the domain's commit, and
// the worker starting the pass that wake-up caused. The server runs in a local
// container and reads the same host clock as this process, so its timestamps and the
// logs' compare. Percentiles (p50/p99) of:
//   - queued -> received: the rest of the verifying transaction, its commit, and
//     delivery of the NOTIFY to the listener's connection;
//   - received -> claimed: everything in this process, up to the claim statement;
//   - pass start -> claimed: of that, the statements a pass runs before it claims
//     (reclaim, renewals, the CA pause), for the domains a notify pass claimed.
func notifyBreakdown(tb testing.TB, d *benchDB, in *workertest.Instance) string {
	tb.Helper()
	var received []time.Time
	for _, e := range in.Logs.FilterMessage("notification").All() {
		received = append(received, e.Time)
	}
	slices.SortFunc(received, time.Time.Compare)
	type pass struct{ at, started time.Time }
	var passes []pass
	for _, e := range in.Logs.FilterMessage("wake-up").All() {
		if at, ok := e.ContextMap()["at"].(time.Time); ok && e.ContextMap()["source"] == listener.SourceNotify {
			passes = append(passes, pass{at: at, started: e.Time})
		}
	}
	slices.SortFunc(passes, func(a, b pass) int { return a.started.Compare(b.started) })
	rows, err := d.pool.Query(d.ctx, `SELECT ssl_queued_at, ssl_last_attempt_at FROM proxy_domains WHERE ssl_status = 'active'`)
	if err != nil {
		tb.Fatalf("read claim times: %v", err)
	}
	type times struct{ queued, claimed time.Time }
	domains, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (times, error) {
		var t times
		err := r.Scan(&t.queued, &t.claimed)
		return t, err
	})
	if err != nil {
		tb.Fatalf("read claim times: %v", err)
	}
	var deliver, worker, preclaim []float64
	for _, t := range domains {
		if i, _ := slices.BinarySearchFunc(received, t.queued, time.Time.Compare); i < len(received) {
			deliver = append(deliver, ms(received[i].Sub(t.queued)))
			worker = append(worker, ms(t.claimed.Sub(received[i])))
		}
		// The pass that claimed it is the last to start before the claim, if a
		// notification that came after the domain's commit started it.
		i, _ := slices.BinarySearchFunc(passes, t.claimed, func(p pass, c time.Time) int { return p.started.Compare(c) })
		if i > 0 && !passes[i-1].at.Before(t.queued) {
			preclaim = append(preclaim, ms(t.claimed.Sub(passes[i-1].started)))
		}
	}
	q := func(xs []float64) string {
		if len(xs) == 0 {
			return "-"
		}
		slices.Sort(xs)
		at := func(f float64) float64 { return xs[min(int(f*float64(len(xs))), len(xs)-1)] }
		return fmt.Sprintf("%.2f/%.2f ms (n=%d)", at(0.5), at(0.99), len(xs))
	}
	return fmt.Sprintf("p50/p99 of queued->received %s, received->claimed %s, notify pass start->claimed %s",
		q(deliver), q(worker), q(preclaim))
}

// windowMaxima is the worst latency of the domains verified in each window of the
// run, in order: a tail made of one burst (the host busy with something else for a
// few seconds) reads differently from one spread over the whole run.
func (d *benchDB) windowMaxima(tb testing.TB, window time.Duration) string {
	tb.Helper()
	rows, err := d.pool.Query(d.ctx, `
WITH l AS (
    SELECT floor(extract(epoch FROM ssl_queued_at - min(ssl_queued_at) OVER ()) / $1)::int AS w,
           extract(epoch FROM ssl_last_attempt_at - ssl_queued_at)::float8 * 1000 AS ms
    FROM proxy_domains WHERE ssl_status = 'active')
SELECT round(max(ms))::int FROM l GROUP BY w ORDER BY w`, window.Seconds())
	if err != nil {
		tb.Fatalf("read latency windows: %v", err)
	}
	maxima, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		tb.Fatalf("read latency windows: %v", err)
	}
	return fmt.Sprintf("max ms per %s of verifying: %s", window, strings.Trim(fmt.Sprint(maxima), "[]"))
}

func writeWakeLatency(tb testing.TB, results []latency) {
	tb.Helper()
	var s strings.Builder
	fmt.Fprintf(&s, "# Wake latency: a tenant's verify to the claim of that domain.\n")
	fmt.Fprintf(&s, "# From ssl_queued_at (clock_timestamp() in the trigger, inside the verifying\n")
	fmt.Fprintf(&s, "# transaction, slightly before its commit) to ssl_last_attempt_at (the claim's\n")
	fmt.Fprintf(&s, "# clock_timestamp() as it writes the row, after its snapshot); both on the database's\n")
	fmt.Fprintf(&s, "# clock. The start leans early (before the verify's commit), the end is the claim itself.\n")
	fmt.Fprintf(&s, "# Domains verified one per transaction, spaced as shown; fake issuer answering at\n")
	fmt.Fprintf(&s, "# once; worker: concurrency 4, --poll-interval 30s; load: 1-min load average after.\n")
	fmt.Fprintf(&s, "# Three notify runs in a row at each spacing: the tail must hold in each, not on average.\n")
	fmt.Fprintf(&s, "# The second table measures the notify runs from each verify's commit instead.\n")
	fmt.Fprintf(&s, "# %s\n", benchEnv())
	fmt.Fprintf(&s, "# command: %s\n\n", benchCommand)
	tw := tabwriter.NewWriter(&s, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tn\tp50 ms\tp95 ms\tp99 ms\tmax ms\tmin ms\tmean ms\tspacing\tpoll\tload\t")
	for _, l := range results {
		poll := "-"
		if l.pollPeriod > 0 {
			poll = l.pollPeriod.String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%s\t%s\t%s\t\n",
			l.mode, l.n, l.p50, l.p95, l.p99, l.max, l.min, l.mean, l.spacing, poll, l.load)
	}
	_ = tw.Flush()
	var fromCommit strings.Builder
	tw = tabwriter.NewWriter(&fromCommit, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tn\tp50 ms\tp95 ms\tp99 ms\tmax ms\tmin ms\tmean ms\tspacing\t")
	for _, l := range results {
		if c := l.commit; c != nil {
			fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%s\t\n",
				l.mode, c.n, c.p50, c.p95, c.p99, c.max, c.min, c.mean, l.spacing)
		}
	}
	_ = tw.Flush()
	if fromCommit.Len() > 0 {
		s.WriteString("\nThe same notify runs from each verify's commit (its transaction's commit timestamp,\n")
		s.WriteString("track_commit_timestamp) to the claim: without the verify's own work after the\n")
		s.WriteString("trigger's stamp (its row and indexes, the other triggers, the commit).\n\n")
		s.WriteString(fromCommit.String())
	}
	var poll *latency
	floor := map[time.Duration]latency{}
	for i := range results {
		switch results[i].mode {
		case "poll-only":
			poll = &results[i]
		case "rig floor":
			floor[results[i].spacing] = results[i]
		}
	}
	notify := func(l latency) bool { return strings.HasPrefix(l.mode, "notify") }
	s.WriteString("\n")
	for _, l := range results {
		if poll != nil && notify(l) {
			fmt.Fprintf(&s, "poll-only / %s (spacing %s): p50 %.0fx, p99 %.0fx\n", l.mode, l.spacing, poll.p50/l.p50, poll.p99/l.p99)
		}
	}
	s.WriteString("\n")
	for _, l := range results {
		if f, ok := floor[l.spacing]; ok && notify(l) {
			fmt.Fprintf(&s, "%s (spacing %s) beyond the rig floor: p50 %+.2f ms, p99 %+.2f ms\n", l.mode, l.spacing, l.p50-f.p50, l.p99-f.p99)
		}
	}
	s.WriteString("\n")
	for _, l := range results {
		fmt.Fprintf(&s, "%s (spacing %s): %s\n", l.mode, l.spacing, l.note)
	}
	writeBenchFile(tb, "wake-latency.txt", s.String())
}
