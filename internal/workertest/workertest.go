// Package workertest starts real workers for tests: built by worker.New from a
// worker.Config, as `certworker run` builds them, on a pool of their own, with their
// logs kept (debug included) and their metrics on a registry of their own, and stopped
// when the test ends.
package workertest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// Directory is the ACME directory workers are given when the test names none.
const Directory = "https://ca.invalid/directory"

// Instance is one running worker.
type Instance struct {
	*worker.Worker
	Name     string
	Logs     *observer.ObservedLogs
	Registry *prometheus.Registry
	Pool     *pgxpool.Pool
	cancel   context.CancelFunc
	stopped  chan struct{}
	err      error
	// ownLog is the logger Start made (keeping every line in Logs), or nil when the
	// test gave its own.
	ownLog *zap.Logger
}

// Start builds a worker from cfg on a pool of its own on dsn, with the worker's
// sessions (its bounds for cfg's lease, as `certworker run` sets them up), and starts
// it; or on cfg.Pool, when set (Start closes it when the test ends).
//
// A benchmark's sessions are also warmed up for the wake path (Session), as
// `certworker run` warms them, so that it measures what ships. A test's are not
// (TestSession): the warm-up plans the wake path's statements six times each on every
// new connection, about 0.1 s of the server's time, and the worker opens Concurrency
// + 4 connections at start, so warming them would cost each worker a second of the
// server's CPU, which the suite's hundreds of workers pay all at once. A test of the
// warm-up itself builds its pool with Session and gives it in cfg.Pool.
//
// What cfg leaves unset is filled for a test: the pool, a logger that keeps every
// line in Logs (a benchmark sets its own, to measure what production logging costs),
// a registry, Owner (name), Directory, and a wake source that reconnects within a
// second. The worker is stopped when the test ends; a failed test prints the end of
// its log.
func Start(t testing.TB, dsn, name string, cfg worker.Config) *Instance {
	t.Helper()
	pool := cfg.Pool
	if pool == nil {
		var err error
		session := TestSession(cfg)
		if _, bench := t.(*testing.B); bench {
			session = Session(cfg)
		}
		if pool, err = queue.NewPoolWith(context.Background(), dsn, session); err != nil {
			t.Fatalf("worker %s: pool: %v", name, err)
		}
	}
	core, logs := observer.New(zapcore.DebugLevel)
	in := &Instance{Name: name, Logs: logs, Registry: prometheus.NewRegistry(), Pool: pool, stopped: make(chan struct{})}
	cfg.Pool = pool
	if cfg.Log == nil {
		cfg.Log = zap.New(core).With(zap.String("instance", name))
		in.ownLog = cfg.Log
	}
	cfg.Registerer = in.Registry
	if cfg.Owner == "" {
		cfg.Owner = name
	}
	if cfg.Directory == "" {
		cfg.Directory = Directory
	}
	if cfg.WakeOptions == (listener.Options{}) {
		cfg.WakeOptions = listener.Options{BackoffMin: 50 * time.Millisecond, BackoffMax: time.Second}
	}
	w, err := worker.New(cfg)
	if err != nil {
		pool.Close()
		t.Fatalf("worker %s: %v", name, err)
	}
	in.Worker = w
	ctx, cancel := context.WithCancel(context.Background())
	in.cancel = cancel
	if err := w.Start(ctx); err != nil {
		cancel()
		pool.Close()
		t.Fatalf("worker %s: start: %v", name, err)
	}
	go func() { in.err = w.Wait(); close(in.stopped) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-in.stopped:
		case <-time.After(time.Minute):
			t.Errorf("worker %s did not stop", name)
		}
		pool.Close()
		if in.ownLog != nil {
			in.checkDomainLines(t)
		}
		if t.Failed() {
			in.DumpLog(t, 200)
		}
	})
	return in
}

// checkDomainLines fails the test for each line the worker logged about a domain
// (one with a "domain" field) that does not also name its row and its tenant
// ("domain_id" and "tenant_id"): an operator follows a tenant's domains by them.
// Every test that starts a worker checks it, whatever paths its worker took.
func (in *Instance) checkDomainLines(t testing.TB) {
	t.Helper()
	for _, e := range in.Logs.All() {
		m := e.ContextMap()
		if _, ok := m["domain"]; !ok {
			continue
		}
		_, id := m["domain_id"]
		_, tenant := m["tenant_id"]
		if !id || !tenant {
			t.Errorf("worker %s logged %q about domain %v without domain_id and tenant_id: %v", in.Name, e.Message, m["domain"], m)
		}
	}
}

// Session is the session set-up of the pool Start makes for a worker with cfg, as
// `certworker run` makes it: the worker's bounds for its lease, and each connection
// warmed up for its wake path (queue.WorkerSessionFor). A benchmark that measures
// what the warm-up saves builds a pool with queue.WorkerSession instead and gives it
// to Start in cfg.Pool.
func Session(cfg worker.Config) queue.Session {
	if cfg.Directory == "" {
		cfg.Directory = Directory
	}
	qc := cfg.Queue
	if f := cfg.Fallback; f != nil {
		qc.Fallback = &issuing.Fallback{Directory: f.Directory, After: f.After}
	}
	return queue.WorkerSessionFor(qc.WithDefaults(), cfg.Directory)
}

// TestSession is Session without the warm-up: the session set-up of the pool Start
// makes for a test.
func TestSession(cfg worker.Config) queue.Session {
	s := Session(cfg)
	s.Warm = nil
	return s
}

// Stop ends the worker as SIGTERM does and waits up to timeout for it to stop; it
// returns Wait's error.
func (in *Instance) Stop(t testing.TB, timeout time.Duration) error {
	t.Helper()
	in.cancel()
	select {
	case <-in.stopped:
		return in.err
	case <-time.After(timeout):
		t.Fatalf("worker %s did not stop within %s", in.Name, timeout)
		return nil
	}
}

// Running reports whether the worker has not stopped.
func (in *Instance) Running() bool {
	select {
	case <-in.stopped:
		return false
	default:
		return true
	}
}

// StartedWith is the source of every order the worker started for domain.
func (in *Instance) StartedWith(domain string) []string {
	var sources []string
	for _, e := range in.Logs.FilterMessage("order started").All() {
		if e.ContextMap()["domain"] == domain {
			sources = append(sources, fmt.Sprint(e.ContextMap()["source"]))
		}
	}
	return sources
}

// Metric is the value of a counter or gauge of the worker's registry, by name and
// label values ("" for an unlabelled one).
func (in *Instance) Metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	return Metric(t, in.Registry, name, labels...)
}

// Metric is the value of a counter or gauge g gathers, by name and label values (0
// when there is none).
func Metric(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelsMatch(m.GetLabel(), labels) {
				switch {
				case m.Counter != nil:
					return m.Counter.GetValue()
				case m.Gauge != nil:
					return m.Gauge.GetValue()
				}
			}
		}
	}
	return 0
}

func labelsMatch(got []*dto.LabelPair, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	for i, l := range got {
		if l.GetValue() != want[i] {
			return false
		}
	}
	return true
}

// WaitForLog waits until the worker has logged msg at least n times.
func (in *Instance) WaitForLog(t testing.TB, msg string, n int, timeout time.Duration) {
	t.Helper()
	Eventually(t, timeout, fmt.Sprintf("worker %s to log %q %d times", in.Name, msg, n), func() bool {
		return in.Logs.FilterMessage(msg).Len() >= n
	})
}

// DumpLog prints how often the worker logged each warning or error (a run's
// first failures are often older than its last lines), then the last n lines of
// its log.
func (in *Instance) DumpLog(t testing.TB, n int) {
	t.Helper()
	all := in.Logs.All()
	type key struct{ level, msg string }
	counts, first, example := map[key]int{}, []key{}, map[key]string{}
	for _, e := range all {
		if e.Level < zapcore.WarnLevel {
			continue
		}
		k := key{e.Level.String(), e.Message}
		if counts[k] == 0 {
			first = append(first, k)
			example[k] = fmt.Sprintf("%s %v", e.Time.Format("15:04:05.000"), e.ContextMap())
		}
		counts[k]++
	}
	var s strings.Builder
	for _, k := range first {
		fmt.Fprintf(&s, "%6d %s %s (first at %s)\n", counts[k], k.level, k.msg, example[k])
	}
	t.Logf("warnings and errors of worker %s, by message, in the order first seen, with the first one's fields:\n%s", in.Name, s.String())
	if len(all) > n {
		all = all[len(all)-n:]
	}
	var b strings.Builder
	for _, e := range all {
		fmt.Fprintf(&b, "%s %s %s %s %v\n", e.Time.Format("15:04:05.000"), e.Level, e.LoggerName, e.Message, e.ContextMap())
	}
	t.Logf("log of worker %s (last %d lines):\n%s", in.Name, len(all), b.String())
}

// WaitForMetric waits until a counter or gauge of the worker's registry reads want,
// and fails showing what it read. An order's outcome is counted after its row's write,
// its log lines and the ledger's settlement, so a test that saw any of those waits for
// the count rather than reading it.
func (in *Instance) WaitForMetric(t testing.TB, want float64, timeout time.Duration, name string, labels ...string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for in.Metric(t, name, labels...) != want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := in.Metric(t, name, labels...); got != want {
		t.Fatalf("%s%q reads %v after %s; want %v", name, labels, got, timeout, want)
	}
}

// Eventually polls cond every 20 ms until it holds, or fails the test after timeout.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
