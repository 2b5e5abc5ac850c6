package certstore_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/certworker/certworker/certstore"
	"github.com/certworker/certworker/certstore/seal"
	"github.com/certworker/certworker/internal/loopback"
	"github.com/certworker/certworker/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testCA issues certificates the way a CA would, for tests that are about serving
// them, not about ACME.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(tb testing.TB) *testCA {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "certstore test root"},
		NotBefore:             time.Now().Add(-48 * time.Hour),
		NotAfter:              time.Now().Add(365 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(tb, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(tb, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// issued is a certificate as the worker stores it: the chain's PEM and the key's.
type issued struct {
	chainPEM, keyPEM string
	serial           *big.Int
	notBefore        time.Time
	notAfter         time.Time
}

// issue signs a certificate for name (whatever name it is stored under), valid from
// notBefore to notAfter.
func (ca *testCA) issue(tb testing.TB, name string, notBefore, notAfter time.Time) issued {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 100))
	require.NoError(tb, err)
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(tb, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(tb, err)
	return issued{
		chainPEM:  string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		keyPEM:    string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})),
		serial:    serial,
		notBefore: notBefore,
		notAfter:  notAfter,
	}
}

// valid is a certificate for name valid from a day ago for 90 days.
func (ca *testCA) valid(tb testing.TB, name string) issued {
	return ca.issue(tb, name, time.Now().Add(-24*time.Hour), time.Now().Add(90*24*time.Hour))
}

// loadCounter counts the store's loads (its calls of certworker_certificate_for for
// one name), per name, as they reach the connection: the database's side of a flood
// of handshakes.
type loadCounter struct {
	mu     sync.Mutex
	byName map[string]int64
}

func (c *loadCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, "certworker_certificate_for($1)") && len(data.Args) > 0 {
		name, _ := data.Args[0].(string)
		c.mu.Lock()
		c.byName[name]++
		c.mu.Unlock()
	}
	return ctx
}

func (c *loadCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *loadCounter) of(name string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byName[name]
}

func (c *loadCounter) total() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, v := range c.byName {
		n += v
	}
	return n
}

// testKEK is a key encryption key made of fill, fill+1, ...
func testKEK(fill byte) []byte {
	k := make([]byte, seal.KeySize)
	for i := range k {
		k[i] = fill + byte(i)
	}
	return k
}

// sealV1 is key sealed in the v1 format, as the worker wrote it before rotation: the
// same bytes as v2 under the same key, without the key id.
func sealV1(t *testing.T, kek, key []byte, aad string) string {
	t.Helper()
	v2, err := seal.Keyring{kek}.Seal(key, aad)
	require.NoError(t, err)
	return seal.PrefixV1 + v2[strings.LastIndex(v2, ":")+1:]
}

// bundle is one test's database, store and HTTPS server.
type bundle struct {
	ctx    context.Context
	dsn    string
	pool   *pgxpool.Pool // the store's
	admin  *pgxpool.Pool // the proxy's and the worker's writes
	store  *certstore.Store
	srv    *loopback.Server
	ca     *testCA
	keys   seal.Keyring
	loads  *loadCounter
	tenant string
	// offline refuses the store's new connections (its pool's and its listener's)
	// while set: a network the test takes away, for as long as it says.
	offline atomic.Bool
	// chain is the certificate the trigger benchmark stores, again and again.
	chain issued

	mu sync.Mutex
	// refused is the last error GetCertificate returned for each name.
	refused map[string]error
}

// setup opens a store on a fresh database of the package's server (or of server,
// when given) and serves HTTPS with it.
func setup(t *testing.T, opts certstore.Options, server ...*pgtest.Server) *bundle {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = zaptest.NewLogger(t)
	}
	return setupTB(t, opts, server...)
}

// setupTB is setup for a test or a benchmark.
func setupTB(t testing.TB, opts certstore.Options, server ...*pgtest.Server) *bundle {
	t.Helper()
	var dsn string
	if len(server) > 0 {
		dsn = server[0].NewDatabase(t)
	} else {
		dsn = pgtest.NewDB(t)
	}
	b := &bundle{ctx: context.Background(), dsn: dsn, ca: newTestCA(t), loads: &loadCounter{byName: map[string]int64{}}, refused: map[string]error{}}
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = b.loads
	cfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
		if b.offline.Load() {
			return errors.New("the test took the store's network away")
		}
		return nil
	}
	b.pool, err = pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(b.pool.Close)
	b.admin, err = pgxpool.New(b.ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(b.admin.Close)

	b.keys = opts.KeyEncryptionKeys
	b.store, err = certstore.Open(b.ctx, b.pool, opts)
	require.NoError(t, err)
	t.Cleanup(b.store.Close)
	b.srv, err = loopback.Serve(&tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		c, err := b.store.GetCertificate(h)
		b.mu.Lock()
		b.refused[h.ServerName] = err
		b.mu.Unlock()
		return c, err
	}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.srv.Close() })
	require.NoError(t, b.admin.QueryRow(b.ctx,
		`INSERT INTO proxy_tenants (name, slug, email) VALUES ('t', $1, 't@example.com') RETURNING id::text`,
		fmt.Sprintf("t-%d", time.Now().UnixNano())).Scan(&b.tenant))
	return b
}

// domain adds a domain row for the bundle's tenant.
func (b *bundle) domain(t testing.TB, name, verification, provider, status string) {
	t.Helper()
	_, err := b.admin.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_provider, ssl_status)
VALUES ($1, $2, $3, 'tok', $4, $5)`, b.tenant, name, verification, provider, status)
	require.NoError(t, err)
}

// execer is a pool or a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// storeCert writes a certificate row as the worker's MarkActive does (an upsert by
// domain), its key sealed with the bundle's keys bound to the name in lower case.
func (b *bundle) storeCert(t testing.TB, q execer, name string, c issued) {
	t.Helper()
	stored, err := b.keys.Seal([]byte(c.keyPEM), strings.ToLower(name))
	require.NoError(t, err)
	b.storeRaw(t, q, name, c.chainPEM, stored, c)
}

// storeRaw writes a certificate row with the stored key as given.
func (b *bundle) storeRaw(t testing.TB, q execer, name, chainPEM, storedKey string, c issued) {
	t.Helper()
	_, err := q.Exec(b.ctx, `
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at, not_before, serial)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (domain) DO UPDATE SET
    certificate_pem = EXCLUDED.certificate_pem, private_key_pem = EXCLUDED.private_key_pem,
    expires_at = EXCLUDED.expires_at, not_before = EXCLUDED.not_before, serial = EXCLUDED.serial,
    updated_at = now()`, name, chainPEM, storedKey, c.notAfter, c.notBefore, c.serial.Text(16))
	require.NoError(t, err)
}

// served adds a verified domain with a valid certificate and returns it.
func (b *bundle) served(t testing.TB, name string) issued {
	t.Helper()
	b.domain(t, name, "verified", "acme", "active")
	c := b.ca.valid(t, name)
	b.storeCert(t, b.admin, name, c)
	return c
}

// handshake makes a TLS handshake with SNI name, verifying the chain for name, and
// returns the serial presented.
func (b *bundle) handshake(t testing.TB, name string) (*big.Int, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	leaf, err := b.srv.Handshake(ctx, name, b.ca.pool)
	if err != nil {
		return nil, err
	}
	return leaf.SerialNumber, nil
}

// requireServes checks that a handshake for name presents serial.
func (b *bundle) requireServes(t *testing.T, name string, serial *big.Int) {
	t.Helper()
	got, err := b.handshake(t, name)
	require.NoError(t, err, "handshake for %s (store said: %v)", name, b.refusal(name))
	require.Equal(t, serial.String(), got.String(), "serial presented for %s", name)
}

// requireRefused checks that a handshake for name fails, presenting no certificate,
// and that the store said why with want.
func (b *bundle) requireRefused(t *testing.T, name string, want error) {
	t.Helper()
	_, err := b.handshake(t, name)
	require.Error(t, err, "a handshake for %s must fail", name)
	require.ErrorIs(t, b.refusal(name), want, "why %s was refused", name)
}

func (b *bundle) refusal(name string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.refused[name]
}

// waitServes polls handshakes until one presents serial, for at most within. A
// handshake is a real visitor's: it may join the reload the notification started.
func (b *bundle) waitServes(t *testing.T, name string, serial *big.Int, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(within)
	for {
		got, err := b.handshake(t, name)
		if err == nil && got.Cmp(serial) == 0 {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: serial %s not presented within %s (last: %v, %v; store said %v)",
				name, serial, within, got, err, b.refusal(name))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitRefused polls handshakes until one fails with want, for at most within.
func (b *bundle) waitRefused(t *testing.T, name string, want error, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		_, err := b.handshake(t, name)
		if err != nil && errors.Is(b.refusal(name), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still served, or refused for another reason, after %s (store said %v)", name, within, b.refusal(name))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitFor polls cond every 5 ms until it holds, for at most within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// long is a TTL no test waits for: whatever a test sees within seconds was caused
// by a notification or a reconnection, not by expiry.
const long = time.Hour
