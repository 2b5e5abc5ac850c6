package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// world is one test's deployment, wired as internal/demo wires it: a fresh database,
// an in-process Pebble validating HTTP-01 against a loopback port of the test's own,
// the HTTP-01 responder on that port answering from the database, and a tenant.
// Workers (instances) are started on it with startWorker.
type world struct {
	ctx    context.Context
	ca     *pebbletest.CA
	pool   *pgxpool.Pool
	dsn    string
	tenant string
	// rootsFile is a copy of the CA's RootsFile, which outlives the CA: Close
	// removes the original, and a test of a CA that went away starts issuers after.
	rootsFile string
}

func newWorld(t testing.TB, opts pebbletest.Options) *world {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	opts.HTTPPort = ln.Addr().(*net.TCPAddr).Port
	w := &world{ctx: context.Background(), ca: pebbletest.StartT(t, opts)}
	w.rootsFile = filepath.Join(t.TempDir(), "roots.pem")
	require.NoError(t, os.WriteFile(w.rootsFile, w.ca.RootsPEM(), 0o600))
	w.pool, w.dsn = pgtest.NewPool(t)
	// One responder for every instance: the tokens live in the database, so the CA's
	// validation request may reach any instance's. It answers for the whole fleet of a
	// test at once, so its look-ups of tokens not yet in memory are not held to one
	// instance's budget (50 a second, 10 at once): Pebble validates the moment a
	// challenge is accepted, from three requests at a time, and when 16 orders' requests
	// came together on a loaded host, before the tokens' notifications, those beyond the
	// budget were answered 404. That failed a validation, which hangs this Pebble
	// (TestE2E_AMassRevocationDrillIsReplacedWithNewcomersServed says how) for the rest
	// of the test. The budget itself is acme's tests' to check.
	responder := acme.NewResponder(w.pool, zap.NewNop(), acme.ResponderOptions{LookupsPerSecond: 10000})
	tokens := listener.New(w.pool, zap.NewNop(), listener.Options{})
	tokens.Listen(acme.TokenChannel, responder)
	require.NoError(t, tokens.Start(w.ctx))
	t.Cleanup(tokens.Stop)
	srv := &http.Server{Handler: responder, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	require.NoError(t, w.pool.QueryRow(w.ctx,
		`INSERT INTO proxy_tenants (name, slug, email) VALUES ('e2e shop', $1, 'owner@e2e.example') RETURNING id::text`,
		"e2e-"+randomHex()).Scan(&w.tenant))
	return w
}

// acmeConfig is an issuer configuration for the world's CA.
func (w *world) acmeConfig() acme.Config {
	return acme.Config{
		DirectoryURL: w.ca.DirectoryURL,
		Email:        "ops@e2e.example",
		CABundle:     w.rootsFile,
		Profile:      pebbletest.DefaultProfile,
		HTTPTimeout:  10 * time.Second,
	}
}

// startWorker starts an instance as `certworker run` builds it (worker.New), with an
// ACME issuer for the world's CA. It is stopped when the test ends; a failed test
// prints the end of its log.
func (w *world) startWorker(t testing.TB, name string, acfg acme.Config, cfg worker.Config) *workertest.Instance {
	t.Helper()
	return w.startWorkerOn(t, name, w.dsn, acfg, cfg)
}

// startWorkerOn is startWorker on dsn (the world's database, through a relay).
func (w *world) startWorkerOn(t testing.TB, name, dsn string, acfg acme.Config, cfg worker.Config) *workertest.Instance {
	t.Helper()
	pool, err := queue.NewPool(w.ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	acfg.Recorder = queue.New(pool, issuing.DefaultConfig())
	issuer, err := acme.New(w.ctx, pool, zap.NewNop(), acfg)
	require.NoError(t, err)
	cfg.Issuer = issuer
	cfg.Directory = issuer.DirectoryURL()
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = 30 * time.Second
	}
	return workertest.Start(t, dsn, name, cfg)
}

// ordersStarted is how many "order started" lines the instance logged for domain.
func ordersStarted(in *workertest.Instance, domain string) int { return len(in.StartedWith(domain)) }

// addDomains inserts domains for the world's tenant, pending verification, then
// verifies them all in one statement, as the proxy does when a tenant clicks
// "verify". It returns their ids in the order of names.
func (w *world) addDomains(t testing.TB, names ...string) []string {
	t.Helper()
	ids := make([]string, len(names))
	for i, n := range names {
		require.NoError(t, w.pool.QueryRow(w.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_method, verification_token, ssl_provider)
VALUES ($1, $2, 'http', 'e2e-token', 'acme') RETURNING id::text`, w.tenant, n).Scan(&ids[i]))
	}
	_, err := w.pool.Exec(w.ctx,
		`UPDATE proxy_domains SET verification_status = 'verified', updated_at = now() WHERE id = ANY($1::uuid[])`, ids)
	require.NoError(t, err)
	return ids
}

// domainRow is what the proxy reads of a domain.
type domainRow struct {
	Status   string
	Attempts int
	Error    *string
}

func (w *world) domain(t testing.TB, id string) domainRow {
	t.Helper()
	var r domainRow
	require.NoError(t, w.pool.QueryRow(w.ctx,
		`SELECT ssl_status, ssl_attempts, ssl_error FROM proxy_domains WHERE id = $1`, id).Scan(&r.Status, &r.Attempts, &r.Error))
	return r
}

// statuses counts the tenant's domains by ssl_status.
func (w *world) statuses(t testing.TB) map[string]int {
	t.Helper()
	rows, err := w.pool.Query(w.ctx, `SELECT ssl_status, count(*) FROM proxy_domains WHERE tenant_id = $1 GROUP BY 1`, w.tenant)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		require.NoError(t, rows.Scan(&s, &n))
		out[s] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// waitFor polls cond (a database read, typically) every 50 ms until it holds, or
// fails the test after timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s%s", timeout, what, caGoroutines())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// caGoroutines lists the goroutines of the test CA (Pebble and the test bed's
// wrapping of it) that are waiting on a lock, for a test that timed out: a CA that
// stopped answering shows where it stopped. Empty when none is.
func caGoroutines() string {
	buf := make([]byte, 16<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var waiting []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if (strings.Contains(g, "letsencrypt/pebble") || strings.Contains(g, "internal/pebbletest")) &&
			(strings.Contains(g, "sync.(*RWMutex)") || strings.Contains(g, "sync.(*Mutex)")) {
			waiting = append(waiting, g)
		}
	}
	if len(waiting) == 0 {
		return ""
	}
	const most = 20
	more := ""
	if len(waiting) > most {
		more = fmt.Sprintf("\n(%d more)", len(waiting)-most)
		waiting = waiting[:most]
	}
	return fmt.Sprintf("; the CA's goroutines waiting on a lock:\n%s%s", strings.Join(waiting, "\n\n"), more)
}

// randomName is a fresh name: tests in parallel share Pebble's DNS (every name is
// 127.0.0.1) but nothing else, and a fresh name keeps their orders apart in logs.
func randomName(prefix string) string { return prefix + "-" + randomHex() + ".example" }

func randomHex() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ordersFor are the CA's accepted orders for name, in the order it accepted them.
func ordersFor(ca *pebbletest.CA, name string) []pebbletest.Order {
	var out []pebbletest.Order
	for _, o := range ca.Orders() {
		if len(o.Identifiers) == 1 && o.Identifiers[0] == name {
			out = append(out, o)
		}
	}
	return out
}
