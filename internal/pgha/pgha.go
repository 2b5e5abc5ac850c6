// Package pgha gives tests a real highly available PostgreSQL: a primary and a
// streaming standby made with pg_basebackup, in two containers of the PostgreSQL
// image (CERTWORKER_PG_IMAGE, as internal/pgtest) on a Docker network of their own,
// and the failover an HA manager performs: the primary dies, the standby is promoted.
//
// The containers run no server of their own (their command is `sleep infinity`):
// the servers are PostgreSQL's own binaries driven with pg_ctl inside them, so that a
// server can crash (`pg_ctl stop -m immediate`) and a node be rebuilt as the standby
// of the other without a container being made again. One pair serves a whole test
// package (Shared, and Main to remove it): after a test that failed over, the next
// Shared rebuilds the old primary as the new primary's standby, so roles swap from
// test to test.
//
// What the worker and the tests reach, every one through a relay of
// internal/netrelay:
//   - each node's front (127.0.0.1:PORT), which URL lists in a multi-host URL with
//     target_session_attrs=read-write, primary first: a test blackholes the front of
//     a primary that died to make it a host that vanished;
//   - each node's replication relay, on the Docker network's gateway, which the
//     standby's WAL receiver connects through: CutReplication makes a standby lag
//     (promotion replays all the WAL a standby received, so only a stream that stops
//     makes it miss a transaction).
//
// The tests of the package drive the pair one at a time: Shared is not for parallel
// tests.
package pgha

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/testcontainers/testcontainers-go"
	tcexec "github.com/testcontainers/testcontainers-go/exec"
	tcnetwork "github.com/testcontainers/testcontainers-go/network"

	"github.com/certworker/certworker/internal/netrelay"
	"github.com/certworker/certworker/internal/pgtest"
)

// Password is the superuser's (postgres) and the replication role's (replicator).
const Password = "postgres"

// dataDir is each node's data directory inside its container.
const dataDir = "/pgdata"

// setupTimeout bounds making the pair, or rebuilding a standby, on a busy host.
const setupTimeout = 3 * time.Minute

// Pair is a primary and its standby.
type Pair struct {
	network *testcontainers.DockerNetwork
	gateway string
	nodes   [2]*node
	// primary is the index of the node that is primary now (or was, until a
	// failover the next Shared heals).
	primary int
	// failedOver: the primary was killed or the standby promoted since the pair was
	// last healthy; Shared rebuilds before handing the pair out again.
	failedOver bool
}

// node is one server and its relays.
type node struct {
	name      string
	container testcontainers.Container
	// ip is the container's address on the pair's network; the relays forward to
	// ip:5432.
	ip string
	// front is what clients connect through, on 127.0.0.1.
	front *netrelay.Relay
	// repl is what the other node's standby replicates through, on the gateway.
	repl *netrelay.Relay
}

var (
	shared    *Pair
	sharedErr error
	sharedMu  sync.Mutex
)

// Main runs the package's tests, then removes the pair, if one was made, and runs
// cleanup (what the package's TestMain made before, such as a binary built for the
// tests: Main exits, so a deferred call would never run).
func Main(m *testing.M, cleanup ...func()) {
	if os.Getenv("TESTCONTAINERS_RYUK_DISABLED") == "" {
		os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	}
	code := m.Run()
	if shared != nil {
		shared.close()
	}
	for _, f := range cleanup {
		f()
	}
	os.Exit(code)
}

// Shared returns the package's pair, healthy: a primary, and a standby streaming
// from it. It makes the pair on first use, and after a test that failed over
// rebuilds the old primary as the standby of the new one.
func Shared(t testing.TB) *Pair {
	t.Helper()
	if testing.Short() {
		t.Skip("needs two PostgreSQL containers; -short runs only the tests that need no container")
	}
	if os.Getenv("TEST_DATABASE_URL") != "" {
		if os.Getenv(pgtest.SkipOwnServer) != "" {
			t.Skipf("needs a PostgreSQL pair of its own; skipped: TEST_DATABASE_URL and %s are set", pgtest.SkipOwnServer)
		}
	}
	sharedMu.Lock()
	defer sharedMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if shared == nil && sharedErr == nil {
		shared, sharedErr = start(ctx)
	}
	if sharedErr != nil {
		t.Fatalf("PostgreSQL pair: %v", sharedErr)
	}
	if err := shared.heal(ctx); err != nil {
		t.Fatalf("PostgreSQL pair: rebuild the standby: %v", err)
	}
	return shared
}

func start(ctx context.Context) (_ *Pair, err error) {
	nw, err := tcnetwork.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("create network: %w", err)
	}
	p := &Pair{network: nw}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	for i, name := range []string{"pg-a", "pg-b"} {
		n, err := p.startNode(ctx, name)
		p.nodes[i] = n // also when partly made: close removes what there is
		if err != nil {
			return nil, err
		}
	}
	if err := p.initPrimary(ctx, p.nodes[0]); err != nil {
		return nil, err
	}
	if _, err := pgtest.Existing(ctx, p.adminURL(p.nodes[0], "postgres")); err != nil {
		return nil, fmt.Errorf("migrated template: %w", err)
	}
	if err := p.initStandby(ctx, p.nodes[1], p.nodes[0]); err != nil {
		return nil, err
	}
	return p, nil
}

// startNode starts a container that runs nothing but waits for pg_ctl, and its
// relays.
func (p *Pair) startNode(ctx context.Context, name string) (*node, error) {
	c, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image:          pgtest.Image(),
			Entrypoint:     []string{"sleep", "infinity"},
			Networks:       []string{p.network.Name},
			NetworkAliases: map[string][]string{p.network.Name: {name}},
		},
		Started: true,
	})
	if err != nil {
		if c != nil {
			_ = c.Terminate(context.Background())
		}
		return nil, fmt.Errorf("start %s: %w", pgtest.Image(), err)
	}
	n := &node{name: name, container: c}
	info, err := c.Inspect(ctx)
	if err != nil {
		return n, fmt.Errorf("inspect %s: %w", name, err)
	}
	ep := info.NetworkSettings.Networks[p.network.Name]
	if ep == nil {
		return n, fmt.Errorf("%s is not on network %s", name, p.network.Name)
	}
	n.ip = ep.IPAddress.String()
	p.gateway = ep.Gateway.String()
	target := net.JoinHostPort(n.ip, "5432")
	if n.front, err = netrelay.Listen("127.0.0.1:0", target); err != nil {
		return n, err
	}
	if n.repl, err = netrelay.Listen(net.JoinHostPort(p.gateway, "0"), target); err != nil {
		return n, err
	}
	return n, nil
}

// initPrimary makes a new cluster on n and starts it: wal_level = logical (for
// --wake logical), WAL senders and slots to spare, a replication role. Passwords are
// checked with md5 rather than SCRAM, as on pgtest's servers: a SCRAM exchange costs
// the race-built client 10 ms of CPU a connect, md5 1.5 ms. initdb stores the
// superuser's password as SCRAM whatever the method, so it is set again once
// password_encryption is md5.
func (p *Pair) initPrimary(ctx context.Context, n *node) error {
	script := `set -e
rm -rf ` + dataDir + ` && mkdir -p ` + dataDir + ` && chown postgres:postgres ` + dataDir + ` && chmod 700 ` + dataDir + `
printf '%s\n' '` + Password + `' > /tmp/pw && chown postgres /tmp/pw
runuser -u postgres -- initdb -D ` + dataDir + ` -U postgres --pwfile=/tmp/pw --auth-local=trust --auth-host=md5 -E UTF8 --locale=C.UTF-8 >/dev/null
echo 'host all all all md5' >> ` + dataDir + `/pg_hba.conf
echo 'host replication all all md5' >> ` + dataDir + `/pg_hba.conf
cat >> ` + dataDir + `/postgresql.conf <<'EOF'
listen_addresses = '*'
unix_socket_directories = '/tmp'
max_connections = 300
fsync = off
wal_level = logical
max_wal_senders = 30
max_replication_slots = 30
wal_keep_size = '512MB'
hot_standby = on
wal_receiver_status_interval = '1s'
password_encryption = md5
EOF
runuser -u postgres -- pg_ctl -D ` + dataDir + ` -l /tmp/pg.log -w -t 120 start >/dev/null
psql -h /tmp -U postgres -qAt -c "ALTER ROLE postgres PASSWORD '` + Password + `'"
psql -h /tmp -U postgres -qAt -c "CREATE ROLE replicator LOGIN REPLICATION PASSWORD '` + Password + `'"
`
	if err := n.exec(ctx, script); err != nil {
		return fmt.Errorf("make the primary on %s: %w", n.name, err)
	}
	return nil
}

// initStandby replaces n's cluster with a base backup of primary's, taken and then
// streamed through primary's replication relay, and starts it as a hot standby.
func (p *Pair) initStandby(ctx context.Context, n, primary *node) error {
	script := `set -e
runuser -u postgres -- pg_ctl -D ` + dataDir + ` -m immediate stop >/dev/null 2>&1 || true
rm -rf ` + dataDir + ` && mkdir -p ` + dataDir + ` && chown postgres:postgres ` + dataDir + ` && chmod 700 ` + dataDir + `
runuser -u postgres -- env PGPASSWORD='` + Password + `' pg_basebackup -h ` + p.gateway + ` -p ` + strconv.Itoa(primary.repl.Port()) +
		` -U replicator -D ` + dataDir + ` -R -X stream -c fast
runuser -u postgres -- pg_ctl -D ` + dataDir + ` -l /tmp/pg.log -w -t 120 start >/dev/null
`
	if err := n.exec(ctx, script); err != nil {
		return fmt.Errorf("make the standby on %s: %w", n.name, err)
	}
	return nil
}

// heal makes the pair healthy again after a test: relays forward, and after a
// failover the old primary is rebuilt as the standby of the new one.
func (p *Pair) heal(ctx context.Context) error {
	for _, n := range p.nodes {
		n.front.Restore()
		n.repl.Restore()
	}
	if !p.failedOver {
		return nil
	}
	// The test may have killed the primary without promoting the standby.
	if err := p.standby().exec(ctx, `runuser -u postgres -- pg_ctl -D `+dataDir+` promote -w -t 120 >/dev/null 2>&1 || true`); err != nil {
		return err
	}
	p.primary = 1 - p.primary
	if err := p.initStandby(ctx, p.standby(), p.primaryNode()); err != nil {
		return err
	}
	p.failedOver = false
	return nil
}

func (p *Pair) primaryNode() *node { return p.nodes[p.primary] }
func (p *Pair) standby() *node     { return p.nodes[1-p.primary] }

// close removes the containers, the relays and the network.
func (p *Pair) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, n := range p.nodes {
		if n == nil {
			continue
		}
		for _, r := range []*netrelay.Relay{n.front, n.repl} {
			if r != nil {
				r.Close()
			}
		}
		if n.container != nil {
			_ = n.container.Terminate(ctx)
		}
	}
	if p.network != nil {
		_ = p.network.Remove(ctx)
	}
}

// adminURL is a superuser's URL of database on n, straight to the server (no relay).
func (p *Pair) adminURL(n *node, database string) string {
	return (&url.URL{Scheme: "postgres", User: url.UserPassword("postgres", Password),
		Host: net.JoinHostPort(n.ip, "5432"), Path: "/" + database, RawQuery: "sslmode=disable"}).String()
}

// PrimaryURL is a superuser's URL of database on the primary, straight to the
// server: for the test's own hand, which must not be cut off with the clients.
func (p *Pair) PrimaryURL(database string) string { return p.adminURL(p.primaryNode(), database) }

// StandbyURL is PrimaryURL for the standby (the new primary, once promoted).
func (p *Pair) StandbyURL(database string) string { return p.adminURL(p.standby(), database) }

// URL is the clients' multi-host URL of database: the primary's front, then the
// standby's, with target_session_attrs=read-write, as an operator writes it for an
// HA pair. After a failover the first host is the one that died.
func (p *Pair) URL(database string) string {
	return multiHost(database, p.primaryNode().front.Addr(), p.standby().front.Addr())
}

// HandURL is URL straight to the servers, past the fronts: for the test's own hand
// and the services it stands in for (the proxy, an HTTP-01 responder), which follow
// the failover but are not what a vanished host is tested on.
func (p *Pair) HandURL(database string) string {
	return multiHost(database, net.JoinHostPort(p.primaryNode().ip, "5432"), net.JoinHostPort(p.standby().ip, "5432"))
}

func multiHost(database string, hosts ...string) string {
	return (&url.URL{Scheme: "postgres", User: url.UserPassword("postgres", Password),
		Host: strings.Join(hosts, ","), Path: "/" + database,
		RawQuery: "sslmode=disable&target_session_attrs=read-write"}).String()
}

// NewDatabase creates a fresh migrated database on the primary and returns its name
// (for URL, PrimaryURL, StandbyURL). The pair is removed with its databases.
func (p *Pair) NewDatabase(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := pgtest.Existing(ctx, p.PrimaryURL("postgres"))
	if err != nil {
		t.Fatalf("PostgreSQL pair: %v", err)
	}
	u, err := url.Parse(s.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

// WaitCaughtUp waits until the standby has replayed everything the primary has
// written so far: a failover now loses nothing.
func (p *Pair) WaitCaughtUp(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var lsn string
	if err := queryOne(ctx, p.PrimaryURL("postgres"), "SELECT pg_current_wal_lsn()::text", &lsn); err != nil {
		t.Fatalf("PostgreSQL pair: primary's position: %v", err)
	}
	for {
		var caught bool
		err := queryOne(ctx, p.StandbyURL("postgres"), "SELECT pg_last_wal_replay_lsn() >= '"+lsn+"'::pg_lsn", &caught)
		if err == nil && caught {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("PostgreSQL pair: the standby did not replay up to %s: %v", lsn, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CutReplication ends the standby's stream and refuses its reconnections: from now
// on it receives nothing, and a promotion loses what the primary commits meanwhile.
func (p *Pair) CutReplication() { p.primaryNode().repl.Cut() }

// KillPrimary crashes the primary (`pg_ctl stop -m immediate`: its sessions end
// without a goodbye, as when the server dies). vanish also blackholes its front
// first, so that clients see a host that answers nothing (a machine gone), not one
// that refuses connections.
func (p *Pair) KillPrimary(t testing.TB, vanish bool) {
	t.Helper()
	p.failedOver = true
	if vanish {
		p.primaryNode().front.Blackhole()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.primaryNode().exec(ctx, `runuser -u postgres -- pg_ctl -D `+dataDir+` -m immediate stop >/dev/null`); err != nil {
		t.Fatalf("PostgreSQL pair: kill the primary: %v", err)
	}
}

// Promote promotes the standby and returns when the promotion completed: the first
// moment a session on it sees it out of recovery (polled every 10 ms), which is when
// the contract's bound starts.
func (p *Pair) Promote(t testing.TB) time.Time {
	t.Helper()
	p.failedOver = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.StandbyURL("postgres"))
	if err != nil {
		t.Fatalf("PostgreSQL pair: connect to the standby: %v", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := p.standby().exec(ctx, `runuser -u postgres -- pg_ctl -D `+dataDir+` promote >/dev/null`); err != nil {
		t.Fatalf("PostgreSQL pair: promote: %v", err)
	}
	for {
		var inRecovery bool
		if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil {
			t.Fatalf("PostgreSQL pair: wait for the promotion: %v", err)
		}
		if !inRecovery {
			return time.Now()
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// exec runs a shell script in n's container as root and returns its output as the
// error when it fails.
func (n *node) exec(ctx context.Context, script string) error {
	code, out, err := n.container.Exec(ctx, []string{"bash", "-c", script}, tcexec.Multiplexed())
	if err != nil {
		return err
	}
	if code != 0 {
		var b bytes.Buffer
		if out != nil {
			_, _ = io.Copy(&b, out)
		}
		return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(b.String()))
	}
	return nil
}

func queryOne(ctx context.Context, dsn, sql string, into any) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.QueryRow(cctx, sql).Scan(into)
}
