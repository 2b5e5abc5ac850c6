package failover

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/pgha"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/queue"
)

// binary is `certworker`, built once for the package by TestMain.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "certworker-failover-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "certworker")
	if out, err := exec.Command("go", "build", "-trimpath", "-o", binary, "../../cmd/certworker").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	pgha.Main(m, func() { _ = os.RemoveAll(dir) })
}

// world is one test's deployment: a fresh database on the package's pair, Pebble, an
// HTTP-01 responder answering from the database on the port Pebble validates
// against, and a tenant. Its pool, on a multi-host URL straight to the servers
// (HandURL), is the proxy's and the test's hand: it follows the failover, but not
// through the fronts a test makes vanish.
type world struct {
	pair   *pgha.Pair
	url    string
	pool   *pgxpool.Pool
	ca     *pebbletest.CA
	tenant string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	pair := pgha.Shared(t)
	db := pair.NewDatabase(t)
	w := &world{pair: pair, url: pair.URL(db)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	w.ca = pebbletest.StartT(t, pebbletest.Options{HTTPPort: ln.Addr().(*net.TCPAddr).Port})
	w.pool, err = queue.NewPoolWith(context.Background(), pair.HandURL(db), queue.Session{})
	require.NoError(t, err)
	t.Cleanup(w.pool.Close)
	responder := acme.NewResponder(w.pool, zap.NewNop(), acme.ResponderOptions{})
	tokens := listener.New(w.pool, zap.NewNop(), listener.Options{})
	tokens.Listen(acme.TokenChannel, responder)
	require.NoError(t, tokens.Start(context.Background()))
	t.Cleanup(tokens.Stop)
	srv := &http.Server{Handler: responder, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	w.tenant = pgtest.Tenant(t, w.pool)
	return w
}

// addDomains inserts domains pending verification, then verifies them in one
// statement, as the proxy does, and returns their ids.
func (w *world) addDomains(t *testing.T, names ...string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ids := make([]string, len(names))
	for i, n := range names {
		require.NoError(t, w.pool.QueryRow(ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_method, verification_token, ssl_provider)
VALUES ($1, $2, 'http', 'failover-token', 'acme') RETURNING id::text`, w.tenant, n).Scan(&ids[i]))
	}
	_, err := w.pool.Exec(ctx, `UPDATE proxy_domains SET verification_status = 'verified', updated_at = now() WHERE id = ANY($1::uuid[])`, ids)
	require.NoError(t, err)
	return ids
}

type domainRow struct {
	Status   string
	Attempts int
}

// domain reads a domain's row. A read on a session the failover ended fails once
// (pgx closes it), so a failed read is tried again, for as long as a failover of the
// tests takes.
func (w *world) domain(t *testing.T, id string) domainRow {
	t.Helper()
	var r domainRow
	var err error
	for deadline := time.Now().Add(time.Minute); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = w.pool.QueryRow(ctx,
			`SELECT ssl_status, ssl_attempts FROM proxy_domains WHERE id = $1`, id).Scan(&r.Status, &r.Attempts)
		cancel()
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.NoError(t, err)
	return r
}

// ordersFor are the CA's accepted orders for name.
func (w *world) ordersFor(name string) []pebbletest.Order {
	var out []pebbletest.Order
	for _, o := range w.ca.Orders() {
		if len(o.Identifiers) == 1 && o.Identifiers[0] == name {
			out = append(out, o)
		}
	}
	return out
}

// finalized is how many of name's orders the CA accepted a finalize for.
func (w *world) finalized(name string) int {
	n := 0
	for _, o := range w.ordersFor(name) {
		if o.Finalized {
			n++
		}
	}
	return n
}

// waitValidated waits until the CA has validated the authorization of every order of
// each name: from then on an order only needs its finalize.
func (w *world) waitValidated(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		workertest.Eventually(t, time.Minute, "the CA to validate "+n, func() bool {
			orders := w.ordersFor(n)
			return len(orders) > 0 && len(orders[0].Authorizations) > 0 &&
				w.ca.AuthorizationStatus(orders[0].Authorizations[0]) == "valid"
		})
	}
}

// proc is one `certworker run` process.
type proc struct {
	name  string
	admin string
	cmd   *exec.Cmd
	logs  *workertest.Buffer
	done  chan struct{}
}

// start runs `certworker run` on the world's multi-host URL with the CA at
// directory, its admin endpoints on a port of its own and no HTTP-01 responder (the
// world's answers). Its safety-net poll is 10 minutes away: what it claims after a
// failover, its wake source woke it for. It is killed when the test ends, and its
// log printed if the test failed.
func (w *world) start(t *testing.T, name, directory string, extra ...string) *proc {
	t.Helper()
	p := &proc{name: name, admin: workertest.FreeAddr(t), logs: &workertest.Buffer{}, done: make(chan struct{})}
	args := append([]string{"run",
		"--database-url", w.url,
		"--acme-directory", directory,
		"--acme-ca-bundle", w.ca.RootsFile,
		"--acme-email", "ops@failover.example",
		"--acme-profile", pebbletest.DefaultProfile,
		"--admin-listen", p.admin,
		"--http01-listen", "",
		"--preflight", "off",
		"--poll-interval", "10m",
		"--limit-orders-per-account", "off", "--limit-certs-per-registered-domain", "off",
		"--limit-certs-per-exact-set", "off", "--limit-failed-authz-per-name", "off",
	}, extra...)
	p.cmd = exec.Command(binary, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	require.NoError(t, p.cmd.Start())
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			lines := strings.Split(p.logs.String(), "\n")
			t.Logf("log of %s:\n%s", name, strings.Join(lines[max(0, len(lines)-120):], "\n"))
		}
	})
	return p
}

// ready reports whether /readyz answers 200.
func (p *proc) ready() bool {
	ok, _ := p.readiness()
	return ok
}

// readiness reports whether /readyz answers 200 and, when it does not, why: its
// answer, or the probe's error.
func (p *proc) readiness() (bool, string) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + p.admin + "/readyz")
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	return resp.StatusCode == http.StatusOK, strings.TrimSpace(string(body))
}

// logLine is one line of a process's JSON log.
type logLine map[string]any

// lines are the process's log lines with message msg, about domain when it is not "".
func (p *proc) lines(msg, domain string) []logLine {
	var out []logLine
	sc := bufio.NewScanner(strings.NewReader(p.logs.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l logLine
		if json.Unmarshal(sc.Bytes(), &l) != nil || l["msg"] != msg {
			continue
		}
		if domain == "" || l["domain"] == domain {
			out = append(out, l)
		}
	}
	return out
}

// waitReady waits until every process answers /readyz with 200.
func waitReady(t *testing.T, procs ...*proc) {
	t.Helper()
	for _, p := range procs {
		workertest.Eventually(t, time.Minute, p.name+" ready", p.ready)
	}
}

// sessions lists what each session on the database's server is doing, for a test
// that failed to say why an instance waited.
func (w *world) sessions(t *testing.T) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := w.pool.Query(ctx, `
SELECT format('%s pid %s %s/%s %s xact %s query %s: %s', backend_type, pid, wait_event_type, wait_event, state,
       round(extract(epoch FROM now() - xact_start)::numeric, 3), round(extract(epoch FROM now() - query_start)::numeric, 3),
       left(regexp_replace(query, '\s+', ' ', 'g'), 160))
FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND (datname = current_database() OR backend_type = 'walsender')
ORDER BY backend_start`)
	if err != nil {
		return "pg_stat_activity: " + err.Error()
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "pg_stat_activity: " + err.Error()
	}
	return strings.Join(lines, "\n")
}

// randomName is a fresh name: Pebble resolves every name to 127.0.0.1.
func randomName(prefix string) string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:]) + ".example"
}
