package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
)

const (
	// floodConns is the flood's size (issue 16: about 20,000 held connections filled
	// the 256 MiB a worker is given), spread over floodProcs processes, each from a
	// loopback address of its own so that no process runs short of ports or file
	// descriptors (20,000 is this machine's hard limit on descriptors).
	floodConns = 20000
	floodProcs = 4
	// floodMemLimit is the Deployment's memory limit (deploy/kubernetes), which the
	// capped responder's process must stay under; floodGoMemLimit is the GOMEMLIMIT
	// the image and the deploy files set.
	floodMemLimit   = 256 << 20
	floodGoMemLimit = "192MiB"
	// floodSettle is how long the flood runs before the order is placed, so that
	// the order is validated in a flood that has reached its steady state;
	// floodAfter is how long it goes on after the order is done.
	floodSettle = 15 * time.Second
	floodAfter  = 5 * time.Second
	// floodOrderWithin bounds the order: Pebble's validation gives up after 15 s.
	floodOrderWithin = 90 * time.Second
	// floodFile is the table the benchmark writes, from the package's directory.
	floodFile    = "../../bench/http01-connections.txt"
	floodCommand = "CERTWORKER_PG_IMAGE=certworker-postgres:15 go test -run '^$' -bench BenchmarkResponderConnectionFlood -benchtime 1x -timeout 20m ./internal/e2e/"
)

// floodResult is one run of the flood against one connection cap.
type floodResult struct {
	cap                   string
	idleRSS, maxRSS, peak int64 // bytes; peak is the kernel's VmHWM
	maxHeap, maxGoros     float64
	maxOpen               float64
	evicted, refused      float64
	flood                 floodStats
	orderIn               time.Duration
	orderStatus           string
	orderErr              string
}

// floodStats sums what the slowflood processes print at the end (internal/slowflood's
// stats, by their JSON names).
type floodStats struct {
	Connects, ClosedByServer int64
	Seconds                  float64
}

// BenchmarkResponderConnectionFlood runs the built `certworker run` as a process of
// its own (no race detector, GOMEMLIMIT as deployed), holds 20,000 slow connections
// against its HTTP-01 responder from four other processes (internal/slowflood: each
// connection sends a header line a second and never ends its headers, and connects
// again at once when closed), and, once the flood has run 15 s, has a tenant verify
// a domain: the worker orders it from Pebble, whose validation must get through the
// flood. It samples the process's resident memory (/proc/PID/status) every 100 ms
// and its Go runtime's figures (/metrics) every second, and reads its peak (VmHWM)
// at the end. It runs at the default cap, and with the cap out of reach (as before
// it existed; then the process's limit on open files is the only one) for
// comparison. Results go to bench/http01-connections.txt.
func BenchmarkResponderConnectionFlood(b *testing.B) {
	if runtime.GOOS != "linux" {
		b.Skip("reads /proc")
	}
	var files syscall.Rlimit
	require.NoError(b, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &files))
	flooder := buildSlowflood(b)
	load := loadAverage()
	var results []floodResult
	for range b.N {
		results = []floodResult{
			runFlood(b, flooder, "4096 (default)", nil),
			runFlood(b, flooder, fmt.Sprintf("none (open files %d)", files.Max), []string{"--http01-max-connections", "1000000"}),
		}
	}
	writeFloodTable(b, results, load)
	capped := results[0]
	require.Equal(b, "active", capped.orderStatus, "the order in flight was not validated under the flood: %s", capped.orderErr)
	require.Less(b, capped.peak, int64(floodMemLimit), "the capped responder's process outgrew the Deployment's memory limit")
	b.ReportMetric(float64(capped.peak)/(1<<20), "peak-MiB")
	b.ReportMetric(capped.orderIn.Seconds(), "order-s")
}

// buildSlowflood builds internal/slowflood.
func buildSlowflood(b *testing.B) string {
	path := filepath.Join(b.TempDir(), "slowflood")
	out, err := exec.Command("go", "build", "-o", path, "../slowflood").CombinedOutput()
	require.NoError(b, err, "go build: %s", out)
	return path
}

// runFlood is one run: a fresh database, Pebble and process, the flood, the order.
func runFlood(b *testing.B, flooder, capName string, extra []string) floodResult {
	r := floodResult{cap: capName}
	pool, dsn := pgtest.NewPool(b)
	ca := pebbletest.StartT(b, pebbletest.Options{})
	roots := filepath.Join(b.TempDir(), "roots.pem")
	require.NoError(b, os.WriteFile(roots, ca.RootsPEM(), 0o600))
	w := &world{ctx: context.Background(), ca: ca, pool: pool, dsn: dsn, tenant: pgtest.Tenant(b, pool)}

	responder := fmt.Sprintf("127.0.0.1:%d", ca.HTTPPort)
	admin := workertest.FreeAddr(b)
	logs := &workertest.Buffer{}
	args := append([]string{"run", "--database-url", dsn,
		"--acme-directory", ca.DirectoryURL, "--acme-ca-bundle", roots,
		"--http01-listen", responder, "--admin-listen", admin,
		"--preflight", "off", "--poll-interval", "5s",
		"--limit-orders-per-account", "off", "--limit-certs-per-registered-domain", "off",
		"--limit-certs-per-exact-set", "off", "--limit-failed-authz-per-name", "off",
	}, extra...)
	cmd := exec.Command(certworkerBinary(b), args...)
	cmd.Env = append(os.Environ(), "GOMEMLIMIT="+floodGoMemLimit)
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(b, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if b.Failed() {
			b.Logf("log of certworker run:\n%s", tail(logs.String(), 60))
		}
	}()
	waitFor(b, 30*time.Second, "certworker run to be ready", func() bool {
		code, _ := scrape(admin, "/readyz")
		return code == 200
	})
	pid := cmd.Process.Pid
	r.idleRSS = procStatus(b, pid, "VmRSS")

	// Sample memory while the flood runs.
	sctx, stopSampling := context.WithCancel(context.Background())
	var sampling sync.WaitGroup
	sampling.Add(1)
	go func() {
		defer sampling.Done()
		r.sample(sctx, pid, admin)
	}()

	floods := startFloods(b, flooder, responder)
	time.Sleep(floodSettle)
	id := w.addDomains(b, randomName("flooded"))[0]
	orderStart := time.Now()
	deadline := orderStart.Add(floodOrderWithin)
	for time.Now().Before(deadline) {
		d := w.domain(b, id)
		r.orderStatus = d.Status
		if d.Error != nil {
			r.orderErr = *d.Error
		}
		if d.Status == "active" || d.Attempts > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.orderIn = time.Since(orderStart)
	time.Sleep(floodAfter)
	r.flood = stopFloods(b, floods)
	stopSampling()
	sampling.Wait()
	r.peak = procStatus(b, pid, "VmHWM")
	return r
}

// sample records the process's resident memory every 100 ms, and its Go figures and
// the limiter's every second, until ctx ends.
func (r *floodResult) sample(ctx context.Context, pid int, admin string) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if rss := readProcStatus(pid, "VmRSS"); rss > r.maxRSS {
			r.maxRSS = rss
		}
		if i%10 != 0 {
			continue
		}
		if _, body := scrape(admin, "/metrics"); body != "" {
			m := metricValues(body)
			r.maxHeap = max(r.maxHeap, m["go_memstats_heap_inuse_bytes"])
			r.maxGoros = max(r.maxGoros, m["go_goroutines"])
			r.maxOpen = max(r.maxOpen, m["certworker_http01_connections_open"])
			r.evicted = max(r.evicted, m[`certworker_http01_connections_closed_total{reason="evicted"}`])
			r.refused = max(r.refused, m[`certworker_http01_connections_closed_total{reason="refused"}`])
		}
	}
}

// floodProc is one slowflood process.
type floodProc struct {
	cmd *exec.Cmd
	out bytes.Buffer
}

// startFloods starts floodProcs slowflood processes against addr, floodConns in all.
func startFloods(b *testing.B, flooder, addr string) []*floodProc {
	var procs []*floodProc
	for i := range floodProcs {
		p := &floodProc{}
		p.cmd = exec.Command(flooder, "-addr", addr, "-conns", strconv.Itoa(floodConns/floodProcs),
			"-local", fmt.Sprintf("127.0.1.%d", i+1), "-every", "1s")
		p.cmd.Stdout = &p.out
		p.cmd.Stderr = os.Stderr
		require.NoError(b, p.cmd.Start())
		procs = append(procs, p)
	}
	b.Cleanup(func() {
		for _, p := range procs {
			if p.cmd.ProcessState == nil {
				_ = p.cmd.Process.Kill()
				_ = p.cmd.Wait()
			}
		}
	})
	return procs
}

// stopFloods stops the processes and sums what they report.
func stopFloods(b *testing.B, procs []*floodProc) floodStats {
	var sum floodStats
	for _, p := range procs {
		require.NoError(b, p.cmd.Process.Signal(syscall.SIGTERM))
	}
	for _, p := range procs {
		require.NoError(b, p.cmd.Wait())
		var s map[string]float64
		require.NoError(b, json.Unmarshal(p.out.Bytes(), &s), "slowflood printed %q", p.out.String())
		sum.Connects += int64(s["connects"])
		sum.ClosedByServer += int64(s["closed_by_server"])
		sum.Seconds = max(sum.Seconds, s["seconds"])
	}
	return sum
}

// procStatus reads a kB field of /proc/PID/status, in bytes.
func procStatus(b *testing.B, pid int, field string) int64 {
	v := readProcStatus(pid, field)
	require.Positive(b, v, "%s of process %d", field, pid)
	return v
}

func readProcStatus(pid int, field string) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// scrape GETs path on the admin address: its status and body, or 0 and "".
func scrape(admin, path string) (int, string) {
	p := &proc{admin: admin}
	code, body := p.get(path)
	if code == 0 {
		return 0, ""
	}
	return code, body
}

// metricValues reads a Prometheus text exposition: series (name and labels as
// written) to value.
func metricValues(body string) map[string]float64 {
	out := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// writeFloodTable writes bench/http01-connections.txt.
func writeFloodTable(b *testing.B, results []floodResult, load string) {
	var sb strings.Builder
	fmt.Fprintf(&sb, "# HTTP-01 responder under a connection flood (issue 16): %d slow connections held against the\n", floodConns)
	fmt.Fprintf(&sb, "# responder of the built `certworker run` (a process of its own, no race detector, GOMEMLIMIT=%s as\n", floodGoMemLimit)
	fmt.Fprintf(&sb, "# deployed) from %d internal/slowflood processes: each connection sends a header line a second,\n", floodProcs)
	sb.WriteString("# never ends its headers, and connects again at once when the server closes it. After the flood has\n")
	fmt.Fprintf(&sb, "# run %s a tenant verifies a domain; the worker orders it from Pebble (in the benchmark's process),\n", floodSettle)
	fmt.Fprintf(&sb, "# whose HTTP-01 validation (15 s timeout) must get through the flood; the flood goes on %s after.\n", floodAfter)
	sb.WriteString("# memory: the process's resident set from /proc/PID/status, VmRSS sampled every 100 ms and VmHWM (the\n")
	sb.WriteString("# kernel's peak) at the end; Go's heap in use and goroutines from its /metrics every second. The\n")
	sb.WriteString("# kernel's socket buffers are not in the resident set (a cgroup counts them too).\n")
	fmt.Fprintf(&sb, "# Everything shares the machine: %s, %s %s/%s, %d CPUs, PostgreSQL image %s; load average (1 min) %s at the start\n",
		time.Now().UTC().Format(time.RFC3339), runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), pgtest.Image(), load)
	fmt.Fprintf(&sb, "# command: %s\n\n", floodCommand)
	tw := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "cap\tidle RSS MiB\tmax RSS MiB\tpeak RSS MiB\tmax heap MiB\tmax goroutines\tmax open\tflood s\tflood connects\tclosed by server\tevicted\trefused\torder\tin s\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.0f\t%.0f\t%.1f\t%d\t%d\t%.0f\t%.0f\t%s\t%.1f\t\n", r.cap,
			mib(r.idleRSS), mib(r.maxRSS), mib(r.peak), r.maxHeap/(1<<20), r.maxGoros, r.maxOpen, r.flood.Seconds,
			r.flood.Connects, r.flood.ClosedByServer, r.evicted, r.refused, r.orderStatus, r.orderIn.Seconds())
	}
	require.NoError(b, tw.Flush())
	for _, r := range results {
		if r.orderStatus != "active" {
			fmt.Fprintf(&sb, "\norder at cap %s: %s (%s)\n", r.cap, r.orderStatus, r.orderErr)
		}
	}
	fmt.Fprintf(&sb, "\nthe Deployment's memory limit: %.0f MiB; load average (1 min) at the end: %s\n", mib(floodMemLimit), loadAverage())
	path := filepath.Clean(floodFile)
	require.NoError(b, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(b, os.WriteFile(path, []byte(sb.String()), 0o644))
	b.Logf("wrote %s:\n%s", path, sb.String())
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// loadAverage is the 1-minute load average, or "?".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}
