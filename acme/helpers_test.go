package acme_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(floodEnv); addr != "" {
		floodMain(addr) // BenchmarkDNS01Flood's load generator
		os.Exit(0)
	}
	pgtest.Main(m)
}

// bed is one test's world: a Pebble, a fresh database, and the port Pebble
// validates HTTP-01 against.
type bed struct {
	ca   *pebbletest.CA
	pool *pgxpool.Pool
	dsn  string
	// ln is the HTTP-01 port's listener; serve puts a handler on it.
	ln net.Listener
}

// setup starts Pebble validating against a loopback port of the test's own, and, when
// respond is true, serves HTTP01Handler on that port from the test's database.
func setup(t testing.TB, opts pebbletest.Options, respond bool) *bed {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	opts.HTTPPort = ln.Addr().(*net.TCPAddr).Port
	b := &bed{ca: pebbletest.StartT(t, opts), ln: ln}
	b.pool, b.dsn = pgtest.NewPool(t)
	if respond {
		b.respond(t, b.pool, zap.NewNop())
	}
	return b
}

// respond answers the HTTP-01 port with a started Responder on pool, as `run` does
// (an unstarted one answers misses beyond its look-up budget with 503, which the CA
// takes as a failed validation when several orders validate at once).
func (b *bed) respond(t testing.TB, pool *pgxpool.Pool, log *zap.Logger) {
	t.Helper()
	r := acme.NewResponder(pool, log, acme.ResponderOptions{})
	tokens := listener.New(pool, zap.NewNop(), listener.Options{})
	tokens.Listen(acme.TokenChannel, r)
	require.NoError(t, tokens.Start(context.Background()))
	t.Cleanup(tokens.Stop)
	b.serve(t, r)
}

// serve answers the HTTP-01 port with h until the test ends.
func (b *bed) serve(t testing.TB, h http.Handler) {
	t.Helper()
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(b.ln) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// caClient is an HTTP client that trusts the CA's TLS certificate.
func (b *bed) caClient(t *testing.T) *http.Client {
	t.Helper()
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(b.ca.RootsPEM()))
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
}

// newPool is another pool on the bed's database: another instance.
func (b *bed) newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), b.dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// config is an issuer configuration for the bed's CA.
func (b *bed) config() acme.Config { return caConfig(b.ca) }

// caConfig is an issuer configuration for ca.
func caConfig(ca *pebbletest.CA) acme.Config {
	return acme.Config{
		DirectoryURL: ca.DirectoryURL,
		Email:        "ops@certworker.example",
		CABundle:     ca.RootsFile,
		Profile:      pebbletest.DefaultProfile,
		HTTPTimeout:  10 * time.Second,
	}
}

func newIssuer(t *testing.T, pool *pgxpool.Pool, log *zap.Logger, cfg acme.Config) *acme.Issuer {
	t.Helper()
	if log == nil {
		log = zap.NewNop()
	}
	if cfg.Recorder == nil {
		cfg.Recorder = queue.New(pool, issuing.DefaultConfig())
	}
	iss, err := acme.New(context.Background(), pool, log, cfg)
	require.NoError(t, err)
	return iss
}

// randomName is a fresh name per order: Pebble would otherwise reuse a valid
// authorization, and tests in parallel would share state.
func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:]) + ".example"
}

// testCtx bounds a test's order.
func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func parseChain(t *testing.T, chainPEM string) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	rest := []byte(chainPEM)
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		require.Equal(t, "CERTIFICATE", block.Type)
		c, err := x509.ParseCertificate(block.Bytes)
		require.NoError(t, err)
		out = append(out, c)
	}
	require.NotEmpty(t, out, "no certificate in chain")
	return out
}

func countRows(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

// newTestPool is a pool on a fresh migrated database of its own.
func newTestPool(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	return pgtest.NewPool(t)
}

func writeFile(path, content string) error {
	return os.WriteFile(path, []byte(content), 0o600)
}

// asAcmeError is errors.As for *acme.Error.
func asAcmeError(err error) (*acme.Error, bool) {
	var e *acme.Error
	ok := errors.As(err, &e)
	return e, ok
}
