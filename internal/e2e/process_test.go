package e2e

// The real `certworker run` binary, as processes, against Pebble: what only a process
// shows (signals, its HTTP endpoints, an outage of the database under several of
// them).

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/netrelay"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
)

var (
	binaryOnce sync.Once
	binaryPath string
	binaryErr  error
)

// certworkerBinary builds cmd/certworker once for the package's tests.
func certworkerBinary(t testing.TB) string {
	t.Helper()
	binaryOnce.Do(func() {
		dir, err := os.MkdirTemp("", "certworker-e2e-")
		if err != nil {
			binaryErr = err
			return
		}
		binaryPath = filepath.Join(dir, "certworker")
		out, err := exec.Command("go", "build", "-trimpath", "-o", binaryPath, "../../cmd/certworker").CombinedOutput()
		if err != nil {
			binaryErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	require.NoError(t, binaryErr)
	return binaryPath
}

// proc is one `certworker run` process.
type proc struct {
	name  string
	cmd   *exec.Cmd
	admin string
	logs  *workertest.Buffer
	done  chan struct{}
	err   error
}

// startProc runs `certworker run` against dsn and the CA's directory, with its admin
// endpoints on a port of its own and the given extra flags. It is killed when the
// test ends, and its log printed if the test failed.
func startProc(t *testing.T, name, dsn, directory, roots string, extra ...string) *proc {
	t.Helper()
	p := &proc{name: name, admin: workertest.FreeAddr(t), logs: &workertest.Buffer{}, done: make(chan struct{})}
	args := append([]string{"run",
		"--database-url", dsn,
		"--acme-directory", directory,
		"--acme-ca-bundle", roots,
		"--acme-email", "ops@e2e.example",
		"--acme-profile", pebbletest.DefaultProfile,
		"--admin-listen", p.admin,
		"--preflight", "off",
		"--log-level", "debug",
		"--limit-orders-per-account", "off", "--limit-certs-per-registered-domain", "off",
		"--limit-certs-per-exact-set", "off", "--limit-failed-authz-per-name", "off",
	}, extra...)
	p.cmd = exec.Command(certworkerBinary(t), args...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	require.NoError(t, p.cmd.Start())
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			lines := strings.Split(p.logs.String(), "\n")
			if len(lines) > 150 {
				lines = lines[len(lines)-150:]
			}
			t.Logf("log of %s:\n%s", name, strings.Join(lines, "\n"))
		}
	})
	return p
}

// get fetches a path of the process's admin endpoints.
func (p *proc) get(path string) (int, string) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + p.admin + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// stop sends SIGTERM and waits for the exit status.
func (p *proc) stop(t *testing.T, timeout time.Duration) int {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("%s did not exit within %s of SIGTERM", p.name, timeout)
	}
	return p.cmd.ProcessState.ExitCode()
}

// processWorld is a database of its own (one that can be stopped), Pebble and a
// tenant, for process tests.
type processWorld struct {
	*world
	srv *pgtest.Server
}

// The CA validates against opts.HTTPPort, or a free port (w.ca.HTTPPort) a process
// then listens on.
func newProcessWorld(t *testing.T, opts pebbletest.Options) *processWorld {
	t.Helper()
	srv := pgtest.StartServer(t)
	w := &world{ctx: context.Background()}
	w.ca = pebbletest.StartT(t, opts)
	w.rootsFile = filepath.Join(t.TempDir(), "roots.pem")
	require.NoError(t, os.WriteFile(w.rootsFile, w.ca.RootsPEM(), 0o600))
	w.pool, w.dsn = srv.NewPool(t)
	w.tenant = pgtest.Tenant(t, w.pool)
	return &processWorld{world: w, srv: srv}
}

// The real `run` command: /readyz answers 200 once it runs, /metrics is Prometheus
// text with the worker's series, a verified domain is issued, and SIGTERM during an
// order hands it back, uncharged, and exits 0 within the grace and the hand-back.
func TestProcess_RunServesItsEndpointsAndHandsBackAtSIGTERM(t *testing.T) {
	t.Parallel()
	w := newProcessWorld(t, pebbletest.Options{ValidationSleep: true, SleepSeconds: 20})
	p := startProc(t, "run", w.dsn, w.ca.DirectoryURL, w.rootsFile,
		"--http01-listen", fmt.Sprintf("127.0.0.1:%d", w.ca.HTTPPort), "--shutdown-grace", "1s")
	waitFor(t, 20*time.Second, "/readyz to answer 200", func() bool { code, _ := p.get("/readyz"); return code == 200 })
	code, body := p.get("/healthz")
	require.Equal(t, 200, code)
	require.Contains(t, body, "ok")

	// Pebble's validation sleeps up to 20 s: the order is in flight when SIGTERM comes.
	id := w.addDomains(t, randomName("sigterm"))[0]
	waitFor(t, 20*time.Second, "the order to start", func() bool { return w.domain(t, id).Status == "provisioning" })
	// The claim's commit is seen a moment before the worker counts the order.
	waitFor(t, 10*time.Second, "the order in /metrics", func() bool {
		code, body = p.get("/metrics")
		return code == 200 && strings.Contains(body, "certworker_orders_in_flight 1")
	})
	for _, series := range []string{"certworker_claims_total", "certworker_orders_in_flight 1", "certworker_listener_connected 1"} {
		require.Contains(t, body, series, "/metrics")
	}
	start := time.Now()
	require.Equal(t, 0, p.stop(t, 30*time.Second), "exit status after SIGTERM")
	t.Logf("exited %s after SIGTERM", time.Since(start).Round(time.Millisecond))
	d := w.domain(t, id)
	require.Equal(t, "pending", d.Status, "the order in flight was not handed back")
	require.Zero(t, d.Attempts, "the hand-back was charged")
	require.Contains(t, p.logs.String(), "order handed back at shutdown")
}

// After a database outage longer than the lease, with every instance alive, no
// domain is issued twice and nothing is charged (issues #9 and #17): two processes
// have orders in flight when PostgreSQL stops for three leases. Neither can renew its
// leases, so each stops its orders at their deadlines, before the leases run out, and
// sends the CA nothing more for them (an order that got its certificate before its
// deadline keeps it, written once the database is back). Once the database is back
// each hands its stopped claims back, uncharged, before the other may reclaim them
// (nobody reclaims until a full lease after its own reconnection), and the domains are
// ordered again. Every domain ends active with exactly one finalized order at Pebble
// and no attempt charged.
//
// The CA reaches a's responder through a relay that holds its validations until the
// database is down: with Pebble's sleep alone (0 to 3 s, drawn per request), an order
// whose draws were all 0 was issued before the others had their tokens, and the six
// were never in flight at once (clean-clone CI of 213872e).
func TestProcess_AnOutageLongerThanTheLeaseOrdersNothingTwice(t *testing.T) {
	t.Parallel()
	const lease = 3 * time.Second
	responder := workertest.FreeAddr(t)
	gate := netrelay.Start(t, responder)
	gate.Blackhole()
	w := newProcessWorld(t, pebbletest.Options{ValidationSleep: true, SleepSeconds: 4, HTTPPort: gate.Port()})
	common := []string{"--lease", lease.String(), "--concurrency", "4", "--poll-interval", "1s", "--retry-base", "1s"}
	a := startProc(t, "a", w.dsn, w.ca.DirectoryURL, w.rootsFile, append(common, "--http01-listen", responder)...)
	b := startProc(t, "b", w.dsn, w.ca.DirectoryURL, w.rootsFile, append(common, "--http01-listen", "")...)
	// b orders too, and the CA validates its orders through a's responder: a must
	// be up before there is anything to order.
	for _, p := range []*proc{a, b} {
		waitFor(t, 30*time.Second, p.name+" ready", func() bool { code, _ := p.get("/readyz"); return code == http.StatusOK })
	}
	names := make([]string, 6)
	for i := range names {
		names[i] = randomName("outage")
	}
	ids := w.addDomains(t, names...)
	// Every order at the CA, its token stored: orders in flight, validations to come.
	waitFor(t, 30*time.Second, "six orders in flight with their tokens stored", func() bool {
		var tokens int
		require.NoError(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM certworker_http01_tokens`).Scan(&tokens))
		return tokens == len(ids) && w.statuses(t)["provisioning"] == len(ids)
	})
	// The responder the CA validates through (a's) answers every token, asked for
	// under its name as the CA does: a token it has answered is held in its memory,
	// which is what answers while the database is away.
	type pending struct{ Token, Domain string }
	rows, err := w.pool.Query(w.ctx, `SELECT token, domain FROM certworker_http01_tokens`)
	require.NoError(t, err)
	tokens, err := pgx.CollectRows(rows, pgx.RowToStructByPos[pending])
	require.NoError(t, err)
	for _, tok := range tokens {
		req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s/.well-known/acme-challenge/%s", responder, tok.Token), nil)
		require.NoError(t, err)
		req.Host = tok.Domain
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "token %s", tok.Token)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, w.srv.Stop(ctx))
	down := time.Now()
	// The validations held since the challenges were accepted go on (Pebble gives each
	// 15 s), after its sleep: some orders are issued before their deadlines, some not.
	gate.Restore()
	time.Sleep(3 * lease)
	require.NoError(t, w.srv.Start(ctx))
	t.Logf("database down %s (lease %s)", time.Since(down).Round(time.Millisecond), lease)
	waitFor(t, time.Minute, "every domain to be active", func() bool { return w.statuses(t)["active"] == len(ids) })
	for _, n := range names {
		require.Equal(t, 1, finalized(w.ca, n), "finalized orders for %s", n)
	}
	t.Logf("every domain active %s after the database came back, one finalized order each", time.Since(down.Add(3*lease)).Round(time.Millisecond))
	for _, id := range ids {
		require.Zero(t, w.domain(t, id).Attempts)
	}
}
