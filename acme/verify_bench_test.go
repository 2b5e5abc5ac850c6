package acme_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/certstore"
	"github.com/certworker/certworker/internal/loopback"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

const (
	// verifyBenchDomains is how many domains are verified, one at a time (the next
	// once the last is served).
	verifyBenchDomains = 20
	verifyBenchFile    = "../bench/verify-to-served.txt"
	verifyBenchCommand = "CERTWORKER_PG_IMAGE=certworker-postgres:15 go test -run '^$' -bench BenchmarkVerifyToServed -benchtime 1x ./acme/"
)

// tokenClock wraps the HTTP-01 responder and remembers when it last answered the
// CA's validation request: the end of the CA's validation, as far as the client can
// tell.
type tokenClock struct {
	next http.Handler
	mu   sync.Mutex
	last time.Time
}

func (c *tokenClock) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.next.ServeHTTP(w, r)
	c.mu.Lock()
	c.last = time.Now()
	c.mu.Unlock()
}

func (c *tokenClock) answered() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// verifyRun is one domain's way from verify to served.
type verifyRun struct {
	active, served time.Duration
	// ca is the CA's share: the time its handlers took to answer the order's
	// requests, and its validation (from its answer to the challenge to the
	// responder's answer to its validation request).
	ca       time.Duration
	requests map[pebbletest.Step]int
}

// verifyBench is a tenant's world for the verify benchmarks: the real worker, ACME
// issuer and responder, certstore behind an HTTPS listener, and Pebble, with a Front
// before it (its directory is the issuer's).
type verifyBench struct {
	bd     *bed
	front  *pebbletest.Front
	clock  *tokenClock
	https  *loopback.Server
	roots  *x509.CertPool
	tenant string
}

func startVerifyBench(b *testing.B) *verifyBench {
	ctx := context.Background()
	bd := setup(b, pebbletest.Options{}, false)
	responder := acme.NewResponder(bd.pool, zap.NewNop(), acme.ResponderOptions{})
	tokens := listener.New(bd.pool, zap.NewNop(), listener.Options{})
	tokens.Listen(acme.TokenChannel, responder)
	require.NoError(b, tokens.Start(ctx))
	b.Cleanup(tokens.Stop)
	v := &verifyBench{bd: bd, front: pebbletest.NewFront(b, bd.ca), clock: &tokenClock{next: responder}}
	bd.serve(b, v.clock)
	cfg := bd.config()
	cfg.DirectoryURL = v.front.DirectoryURL
	cfg.Recorder = queue.New(bd.pool, issuing.DefaultConfig())
	iss, err := acme.New(ctx, bd.pool, zap.NewNop(), cfg)
	require.NoError(b, err)
	w, err := worker.New(worker.Config{
		Pool: bd.pool, Issuer: iss, Log: zap.NewNop(), Owner: "bench", Directory: iss.DirectoryURL(),
		Concurrency: 4, PollInterval: 30 * time.Second, ShutdownGrace: 5 * time.Second,
	})
	require.NoError(b, err)
	wctx, stop := context.WithCancel(ctx)
	require.NoError(b, w.Start(wctx))
	b.Cleanup(func() { stop(); _ = w.Wait() })
	store, err := certstore.Open(ctx, bd.pool, certstore.Options{})
	require.NoError(b, err)
	b.Cleanup(store.Close)
	v.https, err = loopback.Serve(&tls.Config{GetCertificate: store.GetCertificate})
	require.NoError(b, err)
	b.Cleanup(func() { _ = v.https.Close() })
	v.roots = x509.NewCertPool()
	require.True(b, v.roots.AppendCertsFromPEM(bd.ca.IssuerRootsPEM()))
	require.NoError(b, bd.pool.QueryRow(ctx, `INSERT INTO proxy_tenants (name, slug, email) VALUES ('bench', $1, 'o@bench.example') RETURNING id::text`,
		randomName("t")).Scan(&v.tenant))
	return v
}

// one verifies a new domain and measures its way to active and served.
func (v *verifyBench) one(b *testing.B) verifyRun {
	ctx, bd := context.Background(), v.bd
	name := randomName("v")
	var id string
	require.NoError(b, bd.pool.QueryRow(ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_token, ssl_provider)
VALUES ($1, $2, 'bench-token', 'acme') RETURNING id::text`, v.tenant, name).Scan(&id))
	before := bd.ca.Requests()
	handledBefore := len(bd.ca.Handled())
	_, err := bd.pool.Exec(ctx, `UPDATE proxy_domains SET verification_status = 'verified', updated_at = now() WHERE id = $1`, id)
	require.NoError(b, err)
	verified := time.Now()
	var r verifyRun
	deadline := verified.Add(time.Minute)
	for r.active == 0 {
		var status string
		require.NoError(b, bd.pool.QueryRow(ctx, `SELECT ssl_status FROM proxy_domains WHERE id = $1`, id).Scan(&status))
		require.NotEqual(b, "failed", status)
		if status == "active" {
			r.active = time.Since(verified)
			break
		}
		require.True(b, time.Now().Before(deadline), "%s not active within a minute", name)
		time.Sleep(time.Millisecond)
	}
	for r.served == 0 {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		leaf, err := v.https.Handshake(hctx, name, v.roots)
		cancel()
		if err == nil && slices.Contains(leaf.DNSNames, name) {
			r.served = time.Since(verified)
			break
		}
		require.True(b, time.Now().Before(deadline), "%s not served within a minute", name)
		time.Sleep(time.Millisecond)
	}
	r.requests = diff(bd.ca.Requests(), before)
	var challenged time.Time
	for _, h := range bd.ca.Handled()[handledBefore:] {
		r.ca += h.End.Sub(h.Start)
		if h.Step == pebbletest.StepChallenge {
			challenged = h.End
		}
	}
	if at := v.clock.answered(); !challenged.IsZero() && at.After(challenged) {
		r.ca += at.Sub(challenged)
	}
	return r
}

// BenchmarkVerifyToServed: a tenant verifies domains one at a time; the time from the
// verify's commit to the domain's row turning active and to an HTTPS handshake that
// presents its certificate through certstore (the proxy's side), with the real
// worker, ACME issuer and responder, against Pebble with no validation sleep and no
// Retry-After (a CA that answers at once). It reports the times, the share that is
// ours (everything but the CA's answers and its validation), and the requests per
// order. Results go to bench/verify-to-served.txt.
func BenchmarkVerifyToServed(b *testing.B) {
	v := startVerifyBench(b)
	load := loadAvg()
	// The first order registers the account: not measured.
	_ = v.one(b)
	var runs []verifyRun
	b.ResetTimer()
	for range b.N {
		runs = nil
		for range verifyBenchDomains {
			runs = append(runs, v.one(b))
		}
	}
	b.StopTimer()
	b.ReportMetric(median(runs, func(r verifyRun) time.Duration { return r.served }).Seconds()*1000, "served-p50-ms")
	writeVerifyTable(b, load, []verifyWay{{"the curve", runs}})
}

type verifyWay struct {
	name string
	runs []verifyRun
}

func median(runs []verifyRun, f func(verifyRun) time.Duration) time.Duration {
	return quantile(runs, f, 0.5)
}

func quantile(runs []verifyRun, f func(verifyRun) time.Duration, q float64) time.Duration {
	ds := make([]time.Duration, len(runs))
	for i, r := range runs {
		ds[i] = f(r)
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}

func fmtMS(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }

func writeVerifyTable(b *testing.B, load string, ways []verifyWay) {
	var sb strings.Builder
	sb.WriteString("# Verify -> HTTPS: a tenant verifies domains one at a time (the next once the last is served);\n")
	sb.WriteString("# the time from the verify's commit to the row turning active, and to an HTTPS handshake through\n")
	sb.WriteString("# certstore that presents the new certificate (polled every millisecond). Real worker (concurrency 4),\n")
	sb.WriteString("# ACME issuer and responder; in-process Pebble (through a relay) with no validation sleep and no Retry-After.\n")
	sb.WriteString("# 'ours' is everything but the CA's share: the time its handlers took to answer the order's\n")
	sb.WriteString("# requests, and its validation (its answer to the challenge to our answer to its request); Pebble's\n")
	sb.WriteString("# issuance after finalize, a few ms, counts as ours.\n")
	tw := benchTable(&sb, load, verifyBenchCommand)
	fmt.Fprintln(tw, "way\tn\tactive p50 ms\tactive max ms\tserved p50 ms\tserved p90 ms\tserved max ms\tours p50 ms\tCA's p50 ms\trequests/order\t")
	for _, w := range ways {
		var reqs int
		for _, r := range w.runs {
			reqs += total(r.requests)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t\n", w.name, len(w.runs),
			fmtMS(median(w.runs, func(r verifyRun) time.Duration { return r.active })),
			fmtMS(quantile(w.runs, func(r verifyRun) time.Duration { return r.active }, 1)),
			fmtMS(median(w.runs, func(r verifyRun) time.Duration { return r.served })),
			fmtMS(quantile(w.runs, func(r verifyRun) time.Duration { return r.served }, 0.9)),
			fmtMS(quantile(w.runs, func(r verifyRun) time.Duration { return r.served }, 1)),
			fmtMS(median(w.runs, func(r verifyRun) time.Duration { return r.served - r.ca })),
			fmtMS(median(w.runs, func(r verifyRun) time.Duration { return r.ca })),
			float64(reqs)/float64(len(w.runs)))
	}
	require.NoError(b, tw.Flush())
	sb.WriteString("\nrequests per order by step (all orders of the way):\n")
	for _, w := range ways {
		all := map[pebbletest.Step]int{}
		for _, r := range w.runs {
			for k, v := range r.requests {
				all[k] += v
			}
		}
		fmt.Fprintf(&sb, "  %s: %s\n", w.name, format(all))
	}
	b.Log("\n" + sb.String())
	require.NoError(b, os.WriteFile(verifyBenchFile, []byte(sb.String()), 0o644))
}

// benchTable ends a table's header with the time, the machine, its load at the
// start (load) and now, and the command, and gives the writer for its rows.
func benchTable(sb *strings.Builder, load, command string) *tabwriter.Writer {
	fmt.Fprintf(sb, "# %s, %s %s/%s, %d CPUs, load average %s at the start, %s at the end\n",
		time.Now().UTC().Format(time.RFC3339), runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), load, loadAvg())
	fmt.Fprintf(sb, "# command: %s\n\n", command)
	return tabwriter.NewWriter(sb, 2, 4, 2, ' ', tabwriter.AlignRight)
}

func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(raw))[:3], " ")
}
