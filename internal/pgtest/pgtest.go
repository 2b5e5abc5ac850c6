// Package pgtest gives tests a real PostgreSQL: one server per test package, and a
// fresh, migrated database per test, cloned from a template so that tests run in
// parallel and each one sees the real, global claim queue to itself.
//
// Where the server comes from:
//   - TEST_DATABASE_URL, where set: an existing server (the URL's database is only
//     used to create the others; the role needs CREATEDB).
//   - otherwise a container started with testcontainers-go's postgres module, from
//     CERTWORKER_PG_IMAGE (default DefaultImage). Any image that honours the official
//     image's POSTGRES_* variables works: the wait is for the port and a successful
//     query, not for the official image's log lines.
//
// A package that uses it calls Main from its TestMain, which stops the container at
// the end (Ryuk, testcontainers' reaper, is not needed and may not be available).
package pgtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver, for goose and the wait
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/testcontainers/testcontainers-go"
	tcexec "github.com/testcontainers/testcontainers-go/exec"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/certworker/certworker/internal/freeport"
	"github.com/certworker/certworker/migrations"
	"github.com/certworker/certworker/queue"
)

// DefaultImage is used where CERTWORKER_PG_IMAGE is not set.
const DefaultImage = "postgres:17-alpine"

// SkipOwnServer, set with TEST_DATABASE_URL, skips the tests that need a PostgreSQL
// container of their own (StartServer) instead of failing them.
const SkipOwnServer = "CERTWORKER_TEST_SKIP_OWN_SERVER"

// Server is one PostgreSQL server shared by a test package.
type Server struct {
	// AdminURL connects to a maintenance database as a superuser (or a role with
	// CREATEDB).
	AdminURL  string
	container *tcpostgres.PostgresContainer
	// Extra command-line settings the container was started with.
	settings []string
	// admin creates and drops the tests' databases on the package's shared server,
	// which is never stopped: a connection kept rather than two opened for each test.
	// On this project's 2-core machine a connection costs the server about 40 ms of CPU
	// (pgbench -C: 18 ms a connect, 750 page faults of the forked backend). Nil on a
	// server a test stops and starts (StartServer) or that fails over (Existing).
	admin *pgxpool.Pool
}

var (
	shared     *Server
	sharedErr  error
	sharedOnce sync.Once
	// Settings passed to the shared container's postgres command (-c name=value),
	// for packages that need, say, wal_level=logical. Set before the first test.
	Settings []string
)

// Main runs the package's tests, then stops the shared server, if one was started,
// and runs cleanup (for what the package's TestMain made before, such as a binary
// built for the tests: Main exits, so a deferred call would never run).
func Main(m *testing.M, cleanup ...func()) {
	setContainerEnv()
	code := m.Run()
	if shared != nil && shared.admin != nil {
		shared.admin.Close()
	}
	if shared != nil && shared.container != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_ = shared.container.Terminate(ctx)
		cancel()
	}
	for _, f := range cleanup {
		f()
	}
	os.Exit(code)
}

// Shared returns the package's server, starting it (and creating the migrated
// template) on first use.
func Shared(t testing.TB) *Server {
	t.Helper()
	skipShort(t)
	sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		shared, sharedErr = start(ctx, Settings)
		if sharedErr == nil {
			sharedErr = shared.createTemplate(ctx)
		}
	})
	if sharedErr != nil {
		t.Fatalf("test PostgreSQL: %v", sharedErr)
	}
	return shared
}

// StartServer starts a server of its own, not shared, for a test that stops or
// restarts it. It is terminated when the test ends.
//
// Its port on the host is fixed for its lifetime (a free port of 127.0.0.1 chosen
// here), so that AdminURL, and every URL made from it, still reaches it after Stop
// and Start: Docker otherwise maps a new ephemeral port on every start.
func StartServer(t testing.TB, settings ...string) *Server {
	t.Helper()
	skipShort(t)
	if os.Getenv("TEST_DATABASE_URL") != "" {
		// A test that stops its server, or needs server settings, cannot run on a
		// shared one. Skipping silently would report a green run that never ran it.
		if os.Getenv(SkipOwnServer) != "" {
			t.Skipf("needs a PostgreSQL container of its own; skipped: TEST_DATABASE_URL and %s are set", SkipOwnServer)
		}
		t.Fatalf("needs a PostgreSQL container of its own, and TEST_DATABASE_URL is set: "+
			"unset TEST_DATABASE_URL, or set %s=1 to skip such tests knowingly", SkipOwnServer)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	port, err := freePort(t)
	if err != nil {
		t.Fatalf("test PostgreSQL: %v", err)
	}
	s, err := startContainer(ctx, settings, testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
		hc.PortBindings = network.PortMap{
			network.MustParsePort("5432/tcp"): {{HostIP: netip.MustParseAddr("127.0.0.1"), HostPort: strconv.Itoa(port)}},
		}
	}))
	if err != nil {
		t.Fatalf("test PostgreSQL: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = s.container.Terminate(ctx)
	})
	if err := s.createTemplate(ctx); err != nil {
		t.Fatalf("test PostgreSQL: %v", err)
	}
	return s
}

func start(ctx context.Context, settings []string) (*Server, error) {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return &Server{AdminURL: u}, nil
	}
	// The shared server keeps its data in memory (dataInMemory); a StartServer's, which
	// a test stops and starts again, keeps it on disk.
	s, err := startContainer(ctx, settings, dataInMemory()...)
	if err != nil {
		return nil, err
	}
	s.preferDirect(ctx)
	cfg, err := pgxpool.ParseConfig(s.AdminURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 4
	if s.admin, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// dataDir is the data directory the tests' images use: the official image's PGDATA up
// to PostgreSQL 17, and the local image's (internal/pgimage); set for any other image.
const dataDir = "/var/lib/postgresql/data"

// dataInMemory has the server's data directory on a tmpfs rather than a volume.
// Every test clones the template into a database of its own and drops it at its end:
// a few hundred files created and unlinked on the volume's file system each time,
// with the WAL of the copy. On a tmpfs, 40 such creates and drops took half the
// server's CPU they took on the volume (ext4, on this project's 2-core machine). The
// shared server is removed with its package, so nothing is lost that was kept.
func dataInMemory() []testcontainers.ContainerCustomizer {
	return []testcontainers.ContainerCustomizer{
		testcontainers.WithEnv(map[string]string{"PGDATA": dataDir}),
		testcontainers.WithTmpfs(map[string]string{dataDir: "rw"}),
	}
}

// Direct, set to 0, has the shared server reached by the port Docker maps to
// localhost; unset or 1, at its container's own address where it can be
// (preferDirect).
const Direct = "CERTWORKER_PG_DIRECT"

func wantDirect() bool { return os.Getenv(Direct) != "0" }

// preferDirect points the shared server's URL at the container's own address on its
// Docker network, where this host can reach it (a Linux engine on this machine),
// instead of the port Docker maps to localhost. That port is served by docker-proxy,
// a userland relay: every message crosses one more process in each direction, which
// on a 2-core VM costs 0.2 to 0.5 ms a round trip after an idle spell and most of a
// query's time back to back (SELECT 1: 38 us direct, 469 us through the relay). A
// proxy's database has no such relay in front of it, so the benchmarks of latency
// would measure Docker's. Elsewhere the mapped port stays: a remote engine
// (DOCKER_HOST over tcp), wherever the address does not answer (Docker Desktop), and
// wherever the server that answers there is not this container's (the two URLs must
// reach one system identifier).
//
// Tests too, since the relay costs the suite CPU as well as time: 6% of a whole test
// run's CPU on a 2-core machine, sampled with top. A container removed
// under a running package (by another run's cleanup, say) gives its address to the
// next container started, so that the package's tests reach another package's server
// rather than failing to connect: they fail on its missing databases instead. Direct
// set to 0 keeps the mapped port. Only for the shared server: a StartServer's
// container is stopped and started again, and may come back with another address;
// its mapped port is fixed for its lifetime.
func (s *Server) preferDirect(ctx context.Context) {
	if !wantDirect() || s.container == nil {
		return
	}
	// A remote engine's container addresses are on its host, not this one: an
	// answer there would be somebody else's server.
	if dh := os.Getenv("DOCKER_HOST"); dh != "" && !strings.HasPrefix(dh, "unix://") {
		return
	}
	ip, err := s.container.ContainerIP(ctx)
	if err != nil || ip == "" {
		return
	}
	addr := net.JoinHostPort(ip, "5432")
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return
	}
	_ = c.Close()
	u, err := url.Parse(s.AdminURL)
	if err != nil {
		return
	}
	u.Host = addr
	mapped, err := systemID(ctx, s.AdminURL)
	if err != nil {
		return
	}
	if direct, err := systemID(ctx, u.String()); err != nil || direct != mapped {
		return
	}
	s.AdminURL = u.String()
}

// systemID is the server's system identifier, unique to its data directory.
func systemID(ctx context.Context, adminURL string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var id string
	err = conn.QueryRow(ctx, "SELECT system_identifier::text FROM pg_catalog.pg_control_system()").Scan(&id)
	return id, err
}

// Image is the PostgreSQL image the tests start.
func Image() string {
	if img := os.Getenv("CERTWORKER_PG_IMAGE"); img != "" {
		return img
	}
	return DefaultImage
}

// freePort is a TCP port of 127.0.0.1 that nothing listens on, kept for the server
// (freeport) until the test ends: Docker binds it at every start, and between a Stop
// and a Start it must not become a busy host's outgoing connection's source port.
func freePort(t testing.TB) (int, error) {
	port, release, err := freeport.Pick()
	if err != nil {
		return 0, err
	}
	t.Cleanup(release)
	return port, nil
}

func startContainer(ctx context.Context, settings []string, opts ...testcontainers.ContainerCustomizer) (*Server, error) {
	setContainerEnv()
	cmd := []string{"postgres", "-c", "fsync=off", "-c", "max_connections=300"}
	for _, s := range settings {
		cmd = append(cmd, "-c", s)
	}
	c, err := tcpostgres.Run(ctx, Image(), append([]testcontainers.ContainerCustomizer{
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword(adminPassword),
		testcontainers.WithCmd(cmd...),
		testcontainers.WithWaitStrategy(
			wait.ForSQL("5432/tcp", "pgx", func(host string, port network.Port) string {
				return fmt.Sprintf("postgres://postgres:postgres@%s/postgres?sslmode=disable",
					hostPort(host, port.Port()))
			}).WithStartupTimeout(2 * time.Minute).WithPollInterval(200 * time.Millisecond),
		),
	}, opts...)...)
	if err != nil {
		if c != nil {
			_ = c.Terminate(context.Background())
		}
		return nil, fmt.Errorf("start %s: %w", Image(), err)
	}
	u, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = c.Terminate(context.Background())
		return nil, err
	}
	cheapPasswords(ctx, c, u)
	return &Server{AdminURL: u, container: c, settings: settings}, nil
}

// adminPassword is the containers' superuser's.
const adminPassword = "postgres"

// cheapPasswords has the server check passwords with md5 rather than SCRAM, which
// both images use by default: a SCRAM exchange is 4,096 rounds of PBKDF2 on each side
// by design, and the race-built client spent 10 ms of CPU on each connect here
// against 1.5 ms with md5 (200 connects each, measured in-process), on the thousands
// of connects of a run. Passwords are still checked, and a role the tests create
// gets an md5 password. Best effort: where a step fails the server keeps SCRAM.
func cheapPasswords(ctx context.Context, c *tcpostgres.PostgresContainer, adminURL string) {
	code, _, err := c.Exec(ctx, []string{"sh", "-c",
		`sed -i 's/scram-sha-256$/md5/' "${PGDATA:-/var/lib/postgresql/data}/pg_hba.conf"`})
	if err != nil || code != 0 {
		return
	}
	// Connected before the reload: the superuser's password is still SCRAM's.
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	for _, sql := range []string{
		"ALTER SYSTEM SET password_encryption = 'md5'",
		"SET password_encryption = 'md5'",
		"ALTER ROLE CURRENT_USER PASSWORD '" + adminPassword + "'",
		"SELECT pg_reload_conf()",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return
		}
	}
}

func hostPort(host, port string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + port
	}
	return host + ":" + port
}

// templateName is the migrated template's name: a checksum of the migrations, so that
// test packages running at once against one TEST_DATABASE_URL share a template built
// from the same migrations, and a migration edited meanwhile gets a template of its
// own instead of one being dropped while another package clones it.
var templateName = sync.OnceValue(func() string {
	h := sha256.New()
	_ = fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := migrations.FS.ReadFile(path)
		h.Write([]byte(path + "\x00"))
		h.Write(b)
		return err
	})
	return "certworker_tpl_" + hex.EncodeToString(h.Sum(nil))[:12]
})

// createTemplate makes the migrated template this build's migrations need, once per
// server: a template that exists is complete (it is renamed into place only once
// migrated) and is never dropped, since another test package may be cloning it.
// Stale ones, left by older migrations, can be dropped by hand once no test runs.
func (s *Server) createTemplate(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.AdminURL)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	// Packages sharing one server build the template one at a time.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(7427014)"); err != nil {
		return err
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(7427014)") //nolint:errcheck
	name := templateName()
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	building := name + "_building"
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+building); err != nil {
		return fmt.Errorf("drop an interrupted template build: %w", err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+building); err != nil {
		return fmt.Errorf("create template: %w", err)
	}
	db, err := sql.Open("pgx", s.URL(building))
	if err != nil {
		return err
	}
	_, err = migrations.ApplyDB(ctx, db)
	db.Close()
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+building+" RENAME TO "+name); err != nil {
		return fmt.Errorf("put the template in place: %w", err)
	}
	return nil
}

// URL is the server's URL with the database replaced.
func (s *Server) URL(database string) string {
	u, err := url.Parse(s.AdminURL)
	if err != nil {
		panic(fmt.Sprintf("TEST_DATABASE_URL must be a URL: %v", err))
	}
	u.Path = "/" + database
	return u.String()
}

// NewDatabase creates a fresh migrated database, dropped when the test ends, and
// returns its URL.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	if err := s.adminExec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, templateName())); err != nil {
		t.Fatalf("create test database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// An error is the server gone, or the database: nothing left to drop.
		_ = s.adminExec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name))
	})
	return s.URL(name)
}

// adminExec runs sql on the maintenance database: through the shared server's admin
// pool, or a connection of its own.
func (s *Server) adminExec(ctx context.Context, sql string) error {
	if s.admin != nil {
		_, err := s.admin.Exec(ctx, sql)
		return err
	}
	conn, err := pgx.Connect(ctx, s.AdminURL)
	if err != nil {
		return fmt.Errorf("connect to test server: %w", err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// NewDB is a fresh migrated database on the package's shared server.
func NewDB(t testing.TB) string {
	t.Helper()
	return Shared(t).NewDatabase(t)
}

// NewPool is a pool on a fresh migrated database of the package's shared server,
// closed when the test ends.
func NewPool(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	return Shared(t).NewPool(t)
}

// NewPool is a pool on a fresh migrated database of s, closed when the test ends. Its
// sessions are set up as the worker's (queue.ConfigureSession: JIT off, so that plans
// are the worker's) but without the worker's time bounds: the test's own pool stands
// for the proxy and for the test's hand, which fill a million rows in one statement
// or hold a transaction open on purpose. Workers get theirs (workertest.Start).
//
// That includes the worker's connect bound (queue.HostConnectTimeout: 2 s a host, so
// that a worker moves on from a dead host of a multi-host URL): the test's pool has no
// host to move on to, and on a loaded 2-core machine a connect (a backend forked, a
// SCRAM exchange on each side) has waited longer than that in the run queue, failing
// the test's first statement rather than showing anything of the worker. Its connects
// are bounded by ConnectTimeout, as long as the tests' own longest waits.
func (s *Server) NewPool(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	dsn := s.NewDatabase(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	queue.ConfigureSession(cfg, queue.Session{})
	cfg.ConnConfig.ConnectTimeout = ConnectTimeout
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool, dsn
}

// ConnectTimeout bounds a connect of a test's own pool (Server.NewPool).
const ConnectTimeout = time.Minute

// Stop stops the server's container (it keeps its data); Start starts it again. For
// tests of a database that goes away under a running worker; the server must come
// from StartServer.
//
// The server is shut down first with pg_ctl's fast mode, as an operator restarting
// it would: sessions are ended at once and their clients see the connection close.
// Stopping the container alone is not that: Docker's SIGTERM asks PostgreSQL for a
// smart shutdown, which lets connected sessions (a running worker's) go on working
// until Docker kills the server at the timeout, so the outage would start 10 s late;
// and in an image whose PID 1 is not the server the signal may not arrive at all.
func (s *Server) Stop(ctx context.Context) error {
	// Best effort: if the image has no pg_ctl, the container's stop still ends it.
	_, _, _ = s.container.Exec(ctx, []string{"sh", "-c",
		`exec pg_ctl stop -m fast -w -t 20 -D "${PGDATA:-/var/lib/postgresql/data}"`},
		tcexec.WithUser("postgres"))
	timeout := 10 * time.Second
	return s.container.Stop(ctx, &timeout)
}

// Start starts a stopped server again on the same port and waits until a query
// succeeds.
func (s *Server) Start(ctx context.Context) error {
	if err := s.container.Start(ctx); err != nil {
		return err
	}
	for {
		err := s.ping(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("server did not answer after its start: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *Server) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.AdminURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "SELECT 1")
	return err
}

// setContainerEnv settles two testcontainers settings, each only where the
// environment has not chosen already:
//   - Ryuk, its reaper, is off: its image may not be available, and Main and
//     StartServer stop what they start.
//   - Ports are reached on localhost. When testcontainers believes it runs inside a
//     container it dials the default gateway instead, which on a machine whose
//     Docker engine is local is not where the ports are. A remote engine (DOCKER_HOST
//     over tcp) keeps testcontainers' own choice.
func setContainerEnv() {
	if os.Getenv("TESTCONTAINERS_RYUK_DISABLED") == "" {
		os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	}
	dh := os.Getenv("DOCKER_HOST")
	if os.Getenv("TESTCONTAINERS_HOST_OVERRIDE") == "" && (dh == "" || strings.HasPrefix(dh, "unix://")) {
		os.Setenv("TESTCONTAINERS_HOST_OVERRIDE", "localhost")
	}
}

// skipShort skips t under go test -short (make test-short): the tests that need a
// PostgreSQL server are the ones it leaves out, so that the edit-compile loop runs
// the rest with no container.
func skipShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs PostgreSQL; -short runs only the tests that need no container")
	}
}
