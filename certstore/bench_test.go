package certstore_test

// The numbers behind the hand-off (issue #11), measured in one run on one server:
// how soon a stored certificate is presented by a server using the store, what the
// store's cache costs a handshake against a static tls.Config, and what the
// certificate trigger's NOTIFY costs the writes that store certificates. `make bench`
// runs it with -benchtime 1x; it is one long measurement that ignores b.N, so ns/op
// is only the run's wall time. The tables go to ../bench/handoff.txt, replaced on
// each run.

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/certworker/certworker/certstore"
	"github.com/certworker/certworker/internal/loopback"
	"github.com/certworker/certworker/internal/pgtest"
)

const handoffBenchCommand = `CERTWORKER_PG_IMAGE=certworker-postgres:15 go test -run '^$' -bench BenchmarkHandoff -benchtime 1x -timeout 30m ./certstore/   (make bench runs every benchmark over ./...)`

const (
	// renewals measured for store → served: a p99 that rests on two samples.
	renewals = 200
	// handshakeRounds pairs of rounds of handshakeRound, a round of the store and
	// one of the static config back to back in alternating order, so a disturbance
	// of the shared host does not favour one; the median ratio within a pair is
	// reported.
	handshakeRounds = 12
	handshakeRound  = time.Second
	// handshakeClients make handshakes in parallel: two per CPU keep both sides
	// busy on this 2-CPU host without queueing the clients behind each other.
	handshakeClients = 4
	// upsertRounds pairs of rounds of upsertRound, with and without the trigger.
	upsertRounds = 7
	upsertRound  = 3 * time.Second
	// upsertDomains each writer renews in turn: the write set of a worker storing
	// renewals, not one hot row.
	upsertDomains = 200
)

// upsertWriters: 4 is the worker's default --concurrency (at most that many
// MarkActive in flight per instance), 16 several instances or a large one.
var upsertWriters = []int{4, 16}

// handoffServerSettings: fsync=on (the test servers run with fsync=off), because
// NOTIFY's cost is a lock held across the commit's WAL flush, which fsync=off makes
// nearly free; autovacuum=off so that one round's vacuum does not land in another.
var handoffServerSettings = []string{"fsync=on", "autovacuum=off"}

func BenchmarkHandoff(b *testing.B) {
	srv := pgtest.StartServer(b, handoffServerSettings...)
	var out strings.Builder
	fmt.Fprintf(&out, "# Certificate hand-off (issue #11): store -> served, the store's handshakes, the trigger's cost.\n")
	fmt.Fprintf(&out, "# command: %s\n", handoffBenchCommand)
	fmt.Fprintf(&out, "# when: %s; PostgreSQL image %s in a local container, started with %s; %s %s/%s, %d CPUs, GOMAXPROCS %d\n",
		time.Now().UTC().Format(time.RFC3339), pgtest.Image(), strings.Join(handoffServerSettings, " "),
		runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0))
	fmt.Fprintf(&out, "# host load average (1, 5, 15 min) at the start: %s; the host is shared, which is why the\n", loadAverages())
	fmt.Fprintf(&out, "# compared configurations alternate round by round.\n\n")

	storeToServed(b, srv, &out)
	handshakeRate(b, srv, &out)
	triggerCost(b, srv, &out)

	fmt.Fprintf(&out, "\n# host load average at the end: %s\n", loadAverages())
	if err := os.WriteFile("../bench/handoff.txt", []byte(out.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	b.Log("\n" + out.String())
}

// storeToServed renews one name 200 times, each an upsert in its own transaction, and
// after each makes handshakes back to back until one presents the new serial.
func storeToServed(b *testing.B, srv *pgtest.Server, out *strings.Builder) {
	name := "renew.example"
	bb, _ := benchServed(b, srv, name)

	var fromStart, fromCommit, write, handshake []time.Duration
	var handshakes, firstTry int
	for range renewals {
		next := bb.ca.valid(b, name)
		start := time.Now()
		bb.storeCert(b, bb.admin, name, next)
		committed := time.Now()
		n, per := bb.benchWaitServes(b, name, next)
		served := time.Now()
		fromStart = append(fromStart, served.Sub(start))
		fromCommit = append(fromCommit, served.Sub(committed))
		write = append(write, committed.Sub(start))
		handshake = append(handshake, per)
		handshakes += n
		if n == 1 {
			firstTry++
		}
		time.Sleep(10 * time.Millisecond) // renewals of one name are days apart, not back to back
	}
	fmt.Fprintf(out, "## 1. Store -> served: %d renewals of one name, each an upsert of proxy_certificates in its own\n", renewals)
	fmt.Fprintf(out, "## transaction (the worker's MarkActive writes the same row), then TLS handshakes with SNI back to\n")
	fmt.Fprintf(out, "## back, each on a new connection, until one presents the new serial. Store options: the defaults\n")
	fmt.Fprintf(out, "## (TTL %s, so only the notification explains a new serial within it). Wall clock, one process.\n", certstore.DefaultTTL)
	fmt.Fprintf(out, "## 'from write' starts before the upsert is sent; 'from commit' when its commit is acknowledged.\n\n")
	fmt.Fprintf(out, "  %-28s %6s %8s %8s %8s %8s\n", "interval", "n", "p50 ms", "p90 ms", "p99 ms", "max ms")
	for _, row := range []struct {
		what string
		d    []time.Duration
	}{
		{"store -> served (from write)", fromStart},
		{"store -> served (from commit)", fromCommit},
		{"the upsert's own time", write},
		{"one handshake (the last)", handshake},
	} {
		fmt.Fprintf(out, "  %-28s %6d %8.2f %8.2f %8.2f %8.2f\n", row.what, len(row.d),
			pct(row.d, 50), pct(row.d, 90), pct(row.d, 99), pct(row.d, 100))
	}
	fmt.Fprintf(out, "\n  handshakes made: %d for %d renewals; the first handshake after the commit presented the new\n", handshakes, renewals)
	fmt.Fprintf(out, "  certificate in %d of them. The others presented the old one until the notification reached\n", firstTry)
	fmt.Fprintf(out, "  the store: from then on a handshake waits for the reload the notification started.\n\n")
}

// handshakeRate compares handshakes per second through the store's cache with a
// tls.Config holding the same certificate in Certificates.
func handshakeRate(b *testing.B, srv *pgtest.Server, out *strings.Builder) {
	name := "cached.example"
	bb, c := benchServed(b, srv, name)
	static, err := tls.X509KeyPair([]byte(c.chainPEM), []byte(c.keyPEM))
	if err != nil {
		b.Fatal(err)
	}
	plain, err := loopback.Serve(&tls.Config{Certificates: []tls.Certificate{static}})
	if err != nil {
		b.Fatal(err)
	}
	defer plain.Close()
	fromStore, err := loopback.Serve(&tls.Config{GetCertificate: bb.store.GetCertificate})
	if err != nil {
		b.Fatal(err)
	}
	defer fromStore.Close()

	rates := map[string][]float64{}
	var ratios []float64
	for round := range handshakeRounds {
		// A pair of rounds back to back, in alternating order: the host's load drifts
		// slowly, so the ratio within a pair is steadier than the ratio of medians.
		order := []string{"store", "static"}
		if round%2 == 1 {
			slices.Reverse(order)
		}
		pair := map[string]float64{}
		for _, which := range order {
			s := fromStore
			if which == "static" {
				s = plain
			}
			pair[which] = handshakesPerSecond(b, s, name)
			rates[which] = append(rates[which], pair[which])
		}
		ratios = append(ratios, pair["store"]/pair["static"])
	}
	st, pl := median(rates["store"]), median(rates["static"])
	fmt.Fprintf(out, "## 2. Handshakes per second, one name, served from the store's cache (GetCertificate) against a\n")
	fmt.Fprintf(out, "## static tls.Config{Certificates} holding the same ECDSA P-256 certificate; TLS 1.3, full\n")
	fmt.Fprintf(out, "## handshakes (no resumption), %d client goroutines in the same process (chain not verified).\n", handshakeClients)
	fmt.Fprintf(out, "## %d pairs of rounds of %s, one of each server back to back, the order alternating; the\n", handshakeRounds, handshakeRound)
	fmt.Fprintf(out, "## median round of each, and the median of the %d ratios within a pair.\n\n", handshakeRounds)
	fmt.Fprintf(out, "  %-8s %10s   %s\n", "server", "per second", "rounds")
	fmt.Fprintf(out, "  %-8s %10.0f   %s\n", "store", st, floats(rates["store"], "%.0f"))
	fmt.Fprintf(out, "  %-8s %10.0f   %s\n", "static", pl, floats(rates["static"], "%.0f"))
	fmt.Fprintf(out, "\n  store / static: %.3f, the median ratio within a pair (pairs: %s)\n", median(ratios), floats(ratios, "%.2f"))
	one, all := lookupCost(b, bb.store, name)
	fmt.Fprintf(out, "  GetCertificate alone, cached name: %.0f ns of CPU per call from one goroutine, %.0f from %d at\n", one, all, runtime.GOMAXPROCS(0))
	cpuPerHandshake := float64(runtime.GOMAXPROCS(0)) * 1e9 / pl // ns of CPU, both ends, static
	fmt.Fprintf(out, "  once; against %.0f ns of CPU per handshake (both ends, static, median\n", cpuPerHandshake)
	fmt.Fprintf(out, "  round): %.3f%% of a handshake; the differences between rounds are the shared host's.\n\n", 100*max(one, all)/cpuPerHandshake)
}

func handshakesPerSecond(b *testing.B, s *loopback.Server, name string) float64 {
	var n atomic.Int64
	start := time.Now()
	end := start.Add(handshakeRound)
	var wg sync.WaitGroup
	for range handshakeClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := s.Handshake(ctx, name, nil)
				cancel()
				if err != nil {
					b.Errorf("handshake: %v", err)
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds()
}

// lookupCalls is how many GetCertificate calls lookupCost times: long enough (tens
// of ms) for the clock's resolution not to matter.
const lookupCalls = 200_000

// lookupCost is GetCertificate's own cost for a cached name, in ns of CPU per call:
// from one goroutine, and from one per CPU at once (they share the cache's read
// lock). Timed
// by hand: testing.Benchmark cannot run inside a benchmark.
func lookupCost(b *testing.B, store *certstore.Store, name string) (one, parallel float64) {
	hello := &tls.ClientHelloInfo{ServerName: name}
	run := func(goroutines int) float64 {
		start := time.Now()
		var wg sync.WaitGroup
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range lookupCalls {
					if _, err := store.GetCertificate(hello); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		// Each goroutine has a CPU: the wall time of its calls is their CPU time.
		return float64(time.Since(start).Nanoseconds()) / lookupCalls
	}
	return run(1), run(runtime.GOMAXPROCS(0))
}

// triggerCost measures MarkActive-shaped writes (turn the domain active and upsert its
// certificate, one statement, one transaction) from several connections, on a
// database with migration 00007's certificate triggers and on one where they were
// dropped, a store listening on each.
func triggerCost(b *testing.B, srv *pgtest.Server, out *strings.Builder) {
	fmt.Fprintf(out, "## 3. The certificate trigger's cost to the writes that store certificates: the statement of\n")
	fmt.Fprintf(out, "## queue.MarkActive (UPDATE proxy_domains ... RETURNING, then INSERT ... ON CONFLICT DO UPDATE of\n")
	fmt.Fprintf(out, "## proxy_certificates), each in its own transaction, from N connections renewing %d domains in\n", upsertDomains)
	fmt.Fprintf(out, "## turn, for %s per round; %d pairs of rounds, with and without the trigger back to back in\n", upsertRound, upsertRounds)
	fmt.Fprintf(out, "## alternating order (two databases of one server; a certstore.Store listening on each). tx/s is\n")
	fmt.Fprintf(out, "## the median round; the ratio is the median of the ratios within a pair.\n\n")
	fmt.Fprintf(out, "  %7s  %-16s %8s   %s\n", "writers", "trigger", "tx/s", "rounds")
	for _, writers := range upsertWriters {
		with, without := setupBench(b, srv), setupBench(b, srv)
		if _, err := without.admin.Exec(without.ctx, `
DROP TRIGGER certworker_certificate_insert ON proxy_certificates;
DROP TRIGGER certworker_certificate_update ON proxy_certificates;
DROP TRIGGER certworker_certificate_delete ON proxy_certificates`); err != nil {
			b.Fatal(err)
		}
		for _, bb := range []*bundle{with, without} {
			bb.benchDomains(b)
		}
		rates := map[string][]float64{}
		var ratios []float64
		for round := range upsertRounds {
			order := []*bundle{with, without}
			if round%2 == 1 {
				slices.Reverse(order)
			}
			pair := map[*bundle]float64{}
			for _, bb := range order {
				pair[bb] = bb.upsertsPerSecond(b, writers)
			}
			rates["with NOTIFY"] = append(rates["with NOTIFY"], pair[with])
			rates["without"] = append(rates["without"], pair[without])
			ratios = append(ratios, pair[with]/pair[without])
		}
		w, wo := median(rates["with NOTIFY"]), median(rates["without"])
		fmt.Fprintf(out, "  %7d  %-16s %8.0f   %s\n", writers, "with NOTIFY", w, floats(rates["with NOTIFY"], "%.0f"))
		fmt.Fprintf(out, "  %7d  %-16s %8.0f   %s\n", writers, "without", wo, floats(rates["without"], "%.0f"))
		fmt.Fprintf(out, "  %7d  with / without: %.3f, the median ratio within a pair (pairs: %s)\n", writers, median(ratios), floats(ratios, "%.2f"))
	}
}

// setupBench is setup for a benchmark: a store with the default options on a fresh
// database of srv, served over loopback, with no test logger.
func setupBench(b *testing.B, srv *pgtest.Server) *bundle {
	b.Helper()
	return setupTB(b, certstore.Options{Logger: zap.NewNop()}, srv)
}

// benchWaitServes makes handshakes until one presents c, and returns how many it
// made and how long the last one took.
// benchServed is a store on a fresh database of srv serving name.
func benchServed(b *testing.B, srv *pgtest.Server, name string) (*bundle, issued) {
	bb := setupBench(b, srv)
	bb.domain(b, name, "verified", "acme", "active")
	c := bb.ca.valid(b, name)
	bb.storeCert(b, bb.admin, name, c)
	bb.benchWaitServes(b, name, c)
	return bb, c
}

func (bb *bundle) benchWaitServes(b *testing.B, name string, c issued) (int, time.Duration) {
	deadline := time.Now().Add(10 * time.Second)
	for n := 1; ; n++ {
		start := time.Now()
		leaf, err := bb.srv.Handshake(bb.ctx, name, nil)
		took := time.Since(start)
		if err == nil && leaf.SerialNumber.Cmp(c.serial) == 0 {
			return n, took
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: serial %s not served within 10 s (%v)", name, c.serial, err)
		}
	}
}

// benchDomains adds upsertDomains domains, each with a certificate, for the upserts.
func (bb *bundle) benchDomains(b *testing.B) {
	if _, err := bb.admin.Exec(bb.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status)
SELECT $1, 'd' || i || '.example', 'verified', 'tok', 'active' FROM generate_series(1, $2) AS i`,
		bb.tenant, upsertDomains); err != nil {
		b.Fatal(err)
	}
	bb.chain = bb.ca.valid(b, "d1.example")
}

// markActiveSQL is queue.MarkActive's statement without the claim's conditions.
const markActiveSQL = `
WITH d AS (
    UPDATE proxy_domains SET ssl_status = 'active', ssl_expires_at = $2, ssl_error = NULL, ssl_attempts = 0, updated_at = now()
    WHERE domain = $1
    RETURNING domain
)
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at, not_before, issuer, serial, renew_at)
SELECT d.domain, $3, $4, $2, $5, 'bench', $6, $2 - interval '30 days' FROM d
ON CONFLICT (domain) DO UPDATE SET
    certificate_pem = EXCLUDED.certificate_pem, private_key_pem = EXCLUDED.private_key_pem,
    expires_at = EXCLUDED.expires_at, not_before = EXCLUDED.not_before, issuer = EXCLUDED.issuer,
    serial = EXCLUDED.serial, renew_at = EXCLUDED.renew_at, updated_at = now()`

// upsertsPerSecond runs writers connections storing certificates for upsertRound.
func (bb *bundle) upsertsPerSecond(b *testing.B, writers int) float64 {
	cfg, err := pgxpool.ParseConfig(bb.dsn)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = int32(writers)
	pool, err := pgxpool.NewWithConfig(bb.ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	var n atomic.Int64
	ctx, cancel := context.WithTimeout(bb.ctx, upsertRound)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ctx.Err() == nil; i += writers {
				name := fmt.Sprintf("d%d.example", i%upsertDomains+1)
				_, err := pool.Exec(ctx, markActiveSQL, name, bb.chain.notAfter, bb.chain.chainPEM,
					bb.chain.keyPEM+fmt.Sprint(i), bb.chain.notBefore, fmt.Sprint(i))
				if err == nil {
					n.Add(1)
				} else if ctx.Err() == nil {
					b.Errorf("upsert: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds()
}

func pct(d []time.Duration, p float64) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p / 100)
	return float64(s[i]) / float64(time.Millisecond)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// floats formats v with format, separated by spaces.
func floats(v []float64, format string) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf(format, x)
	}
	return strings.Join(parts, " ")
}

// loadAverages is the host's 1, 5 and 15 minute load averages.
func loadAverages() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(raw))[:3], " ")
}
