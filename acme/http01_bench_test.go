package acme_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

const (
	// floodFor is how long the flood lasts (issue #12: 10 s).
	floodFor = 10 * time.Second
	// floodConns is the number of keep-alive connections the flood sends on, each
	// one request after another. A miss beyond the look-up budget is held
	// DefaultMissWait (100 ms), so a connection sends at most 10 a second: 1,024 of
	// them leave the two cores, not the wait, as the limit.
	floodConns = 1024
	// floodOrderAfter: the order starts once the flood is under way, so that it runs
	// inside it from its first request to its last.
	floodOrderAfter = time.Second
)

// BenchmarkHTTP01Flood floods the started responder on loopback with random
// well-formed tokens for 10 s, as fast as this machine sends them, while an order is
// in flight at Pebble (validation sleep on), and counts the test database's
// transactions over the flood (pg_stat_database). The order must complete: its token
// is answered in the middle of the flood. Results go to bench/http01.txt.
func BenchmarkHTTP01Flood(b *testing.B) {
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	ca := pebbletest.StartT(b, pebbletest.Options{HTTPPort: ln.Addr().(*net.TCPAddr).Port, ValidationSleep: true})
	pool, dsn := pgtest.NewPool(b)
	reg := prometheus.NewRegistry()
	responder := acme.NewResponder(pool, zap.NewNop(), acme.ResponderOptions{Registerer: reg})
	tokens := listener.New(pool, zap.NewNop(), listener.Options{})
	tokens.Listen(acme.TokenChannel, responder)
	require.NoError(b, tokens.Start(ctx))
	b.Cleanup(tokens.Stop)
	// The server run's newServer makes (cmd/certworker/run.go).
	srv := &http.Server{Handler: responder, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 10 * time.Second, IdleTimeout: 30 * time.Second, MaxHeaderBytes: 8 << 10}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Close() })
	issuer, err := acme.New(ctx, pool, zap.NewNop(), acme.Config{Recorder: queue.New(pool, issuing.DefaultConfig()),
		DirectoryURL: ca.DirectoryURL, CABundle: ca.RootsFile, HTTPTimeout: 30 * time.Second,
		Profile: pebbletest.DefaultProfile,
	})
	require.NoError(b, err)

	stats, err := pgx.Connect(ctx, dsn)
	require.NoError(b, err)
	defer stats.Close(ctx)
	var dbName string
	require.NoError(b, stats.QueryRow(ctx, "SELECT current_database()").Scan(&dbName))
	xacts := func() int64 {
		// A backend reports its counts when it goes idle, but at most once a second,
		// and one that went idle within that second reports 10 s later (PostgreSQL
		// 15's PGSTAT_IDLE_INTERVAL): 11 s makes every transaction before the call
		// visible.
		time.Sleep(11 * time.Second)
		var n int64
		_, _ = stats.Exec(ctx, "SELECT pg_stat_clear_snapshot()")
		require.NoError(b, stats.QueryRow(ctx,
			`SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1`, dbName).Scan(&n))
		return n
	}

	load := loadAverage()
	quietStart := xacts()
	time.Sleep(floodFor)
	quiet := xacts() - quietStart - 1 // less the first reading's own transaction

	before := xacts()
	flood := startFlood(ln.Addr().String())
	time.Sleep(floodOrderAfter)
	orderStart := time.Now()
	name := randomName("flood")
	cert, orderErr := issuer.Issue(ctx, issuing.Request{Domain: name})
	orderTook := time.Since(orderStart)
	sent, byStatus, took := flood.wait()
	during := xacts() - before - 1
	require.NoError(b, orderErr, "the order failed under the flood")
	leaf, err := issuing.LeafFromPEM(cert.ChainPEM)
	require.NoError(b, err)
	require.Equal(b, []string{name}, leaf.DNSNames)

	results := map[string]float64{}
	families, err := reg.Gather()
	require.NoError(b, err)
	for _, mf := range families {
		if mf.GetName() == "certworker_http01_requests_total" {
			for _, m := range mf.GetMetric() {
				results[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	rate := float64(sent) / took.Seconds()
	b.ReportMetric(rate, "req/s")
	b.ReportMetric(float64(during), "db-xacts")

	var out strings.Builder
	fmt.Fprintf(&out, "# HTTP-01 responder under a flood (issue #12): random well-formed tokens on loopback for %s,\n", floodFor)
	fmt.Fprintf(&out, "# as fast as %d keep-alive connections send them one after another, while an order is in flight at\n", floodConns)
	fmt.Fprintf(&out, "# Pebble (validation sleep on: 0 to 5 s before each validation). The started acme.Responder behind\n")
	fmt.Fprintf(&out, "# an http.Server with run's limits; load generator, responder, Pebble and PostgreSQL share the machine.\n")
	fmt.Fprintf(&out, "# method: the test database's xact_commit + xact_rollback (pg_stat_database) read before and 11 s\n")
	fmt.Fprintf(&out, "# after the flood, less the reading's own; the same over %s without a flood or an order for comparison.\n", floodFor)
	fmt.Fprintf(&out, "# %s, %s %s/%s, %d CPUs, PostgreSQL image %s; load average (1 min) %s at the start\n",
		time.Now().UTC().Format(time.RFC3339), runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), pgtest.Image(), load)
	fmt.Fprintf(&out, "# command: CERTWORKER_PG_IMAGE=certworker-postgres:15 go test -run '^$' -bench HTTP01Flood -benchtime 1x -timeout 10m ./acme/\n\n")
	fmt.Fprintf(&out, "flood: %d requests in %.1f s = %.0f requests/s; answers by status: %s\n", sent, took.Seconds(), rate, statusLine(byStatus))
	fmt.Fprintf(&out, "responder results: memory %.0f, database %.0f, not_found %.0f, limited %.0f, malformed %.0f, unavailable %.0f\n",
		results["memory"], results["database"], results["not_found"], results["limited"], results["malformed"], results["unavailable"])
	fmt.Fprintf(&out, "database transactions: %d during the flood (%.1f a second; look-ups allowed: %d a second), %d in %s without it\n",
		during, float64(during)/took.Seconds(), acme.DefaultLookupsPerSecond, quiet, floodFor)
	fmt.Fprintf(&out, "the order: issued for %s in %.2f s, started %s into the flood; its token answered from memory during it\n",
		name, orderTook.Seconds(), floodOrderAfter)
	fmt.Fprintf(&out, "load average (1 min) at the end: %s\n", loadAverage())
	b.Log("\n" + out.String())
	require.NoError(b, os.WriteFile(filepath.Join("..", "bench", "http01.txt"), []byte(out.String()), 0o644))
}

// flood sends GETs of random well-formed tokens until floodFor has passed.
type flood struct {
	wg       sync.WaitGroup
	start    time.Time
	sent     atomic.Int64
	mu       sync.Mutex
	byStatus map[string]int64
}

func startFlood(addr string) *flood {
	f := &flood{start: time.Now(), byStatus: map[string]int64{}}
	deadline := f.start.Add(floodFor)
	tr := &http.Transport{MaxIdleConnsPerHost: floodConns, MaxConnsPerHost: floodConns, DisableCompression: true}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	for range floodConns {
		f.wg.Go(func() {
			local := map[string]int64{}
			for time.Now().Before(deadline) {
				resp, err := client.Get("http://" + addr + "/.well-known/acme-challenge/" + randomToken())
				f.sent.Add(1)
				if err != nil {
					local["error"]++
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				local[fmt.Sprint(resp.StatusCode)]++
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			for k, v := range local {
				f.byStatus[k] += v
			}
		})
	}
	return f
}

func (f *flood) wait() (int64, map[string]int64, time.Duration) {
	f.wg.Wait()
	return f.sent.Load(), f.byStatus, time.Since(f.start)
}

func statusLine(m map[string]int64) string {
	var parts []string
	for _, k := range []string{"200", "404", "503", "error"} {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
	}
	for k, v := range m {
		if k != "200" && k != "404" && k != "503" && k != "error" {
			parts = append(parts, fmt.Sprintf("%s %d", k, v))
		}
	}
	return strings.Join(parts, ", ")
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}
