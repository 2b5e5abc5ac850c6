package acme_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/listener"
)

func storeToken(t *testing.T, pool *pgxpool.Pool, token, keyAuth string, expiresIn time.Duration) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
INSERT INTO certworker_http01_tokens (token, key_authorization, domain, expires_at)
VALUES ($1, $2, 'h.example', now() + $3 * interval '1 millisecond')`,
		token, keyAuth, expiresIn.Milliseconds())
	require.NoError(t, err)
}

// get asks h for path with the Host the CA sends for the name storeToken stores
// tokens for.
func get(t *testing.T, h http.Handler, method, path string) *http.Response {
	t.Helper()
	return getAs(t, h, "h.example", method, path)
}

func getAs(t *testing.T, h http.Handler, host, method, path string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, path, nil)
	req.Host = host
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func body(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// The responder serves what any instance stored, and nothing else. Guards against
// serving expired tokens of dead orders, answering paths outside the challenge
// directory, and a wrong content type (some CAs are strict about it).
func TestHTTP01Handler_ServesStoredUnexpiredTokensOnly(t *testing.T) {
	t.Parallel()
	pool, _ := newTestPool(t)
	h := acme.HTTP01Handler(pool, zap.NewNop())
	storeToken(t, pool, "live-token_1", "live-token_1.thumbprint", time.Hour)
	storeToken(t, pool, "expired-token", "expired-token.thumbprint", -time.Second)

	resp := get(t, h, http.MethodGet, "/.well-known/acme-challenge/live-token_1")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/plain", resp.Header.Get("Content-Type"))
	require.Equal(t, "live-token_1.thumbprint", body(t, resp))

	resp = get(t, h, http.MethodHead, "/.well-known/acme-challenge/live-token_1")
	require.Equal(t, http.StatusOK, resp.StatusCode, "HEAD is answered like GET")
	require.Empty(t, body(t, resp))

	for _, tc := range []struct{ method, path string }{
		{http.MethodGet, "/.well-known/acme-challenge/unknown-token"},
		{http.MethodGet, "/.well-known/acme-challenge/expired-token"},
		{http.MethodGet, "/.well-known/acme-challenge/"},
		{http.MethodGet, "/.well-known/acme-challenge/live-token_1/more"},
		{http.MethodGet, "/.well-known/acme-challenge/live-token_1.x"},
		{http.MethodGet, "/.well-known/acme-challenge/" + strings.Repeat("a", 300)},
		{http.MethodGet, "/"},
		{http.MethodGet, "/live-token_1"},
		{http.MethodPost, "/.well-known/acme-challenge/live-token_1"},
		{http.MethodDelete, "/.well-known/acme-challenge/live-token_1"},
	} {
		resp := get(t, h, tc.method, tc.path)
		require.Equal(t, http.StatusNotFound, resp.StatusCode, "%s %s", tc.method, tc.path)
		require.NotContains(t, body(t, resp), "thumbprint")
	}
}

// While the database is unreachable the responder says 503 (the CA may retry), and
// the client learns nothing of the database; the error goes to the log. Guards
// against a 404 that makes the CA fail the challenge for good, and against the
// database's address or user shown to anyone on the internet.
func TestHTTP01Handler_DatabaseUnreachableIs503WithGenericBody(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(),
		"postgres://certworker:hunter2secret@"+workertest.FreeAddr(t)+"/certworker?sslmode=disable&connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	core, logs := observer.New(zap.DebugLevel)
	h := acme.HTTP01Handler(pool, zap.New(core))

	start := time.Now()
	resp := get(t, h, http.MethodGet, "/.well-known/acme-challenge/some-token")
	require.Less(t, time.Since(start), 10*time.Second)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	got := body(t, resp)
	require.Equal(t, "service unavailable\n", got)
	for _, leak := range []string{"127.0.0.1", "certworker", "hunter2", "dial", "connect", "postgres"} {
		require.NotContains(t, got, leak)
	}
	require.Equal(t, 1, logs.FilterMessage("HTTP-01 token lookup failed").Len(), "the database error is logged")
	for _, e := range logs.All() {
		for _, v := range e.ContextMap() {
			require.NotContains(t, toString(v), "hunter2", "the password must not be logged")
		}
	}

	// Paths that are not challenges do not need the database: still 404.
	require.Equal(t, http.StatusNotFound, get(t, h, http.MethodGet, "/").StatusCode)
}

func toString(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	if e, ok := v.(error); ok {
		return e.Error()
	}
	return ""
}

// lookupCounter counts the token look-ups made on a pool's connections, leaving out
// the responder's own listener connection (the one that ran LISTEN), whose re-reads
// follow notifications and are not what a request costs.
type lookupCounter struct {
	mu        sync.Mutex
	listeners map[*pgx.Conn]bool
	lookups   int
}

func (c *lookupCounter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case strings.HasPrefix(data.SQL, "LISTEN"):
		c.listeners[conn] = true
	case strings.Contains(data.SQL, "FROM certworker_http01_tokens") && !c.listeners[conn]:
		c.lookups++
	}
	return ctx
}

func (c *lookupCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *lookupCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lookups
}

// countedPool is a pool on dsn whose token look-ups are counted.
func countedPool(t *testing.T, dsn string) (*pgxpool.Pool, *lookupCounter) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	counter := &lookupCounter{listeners: map[*pgx.Conn]bool{}}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, counter
}

func startResponder(t *testing.T, pool *pgxpool.Pool, opts acme.ResponderOptions) *acme.Responder {
	t.Helper()
	r := acme.NewResponder(pool, zap.NewNop(), opts)
	tokens := listener.New(pool, zap.NewNop(), listener.Options{})
	tokens.Listen(acme.TokenChannel, r)
	require.NoError(t, tokens.Start(context.Background()))
	t.Cleanup(tokens.Stop)
	return r
}

func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

const challenge = "/.well-known/acme-challenge/"

// Paths that cannot hold an ACME token are 404 without asking the database: here the
// database cannot be reached, and would make any question a 503. Guards against
// spending a query (or a 503 the CA reads as "try again") on garbage.
func TestResponder_MalformedTokenIs404WithoutTheDatabase(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(),
		"postgres://certworker:pw@"+workertest.FreeAddr(t)+"/certworker?sslmode=disable&connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	h := acme.HTTP01Handler(pool, zap.NewNop())
	for _, token := range []string{
		"", "AAAA=", "AAAA%3D", "a+b", "a.b", "a%2Fb", "a%20b", "%C3%A9t%C3%A9", "..%2F..%2Fetc",
		strings.Repeat("a", 257), "tok%00en",
	} {
		require.Equal(t, http.StatusNotFound, get(t, h, http.MethodGet, challenge+token).StatusCode, token)
	}
	require.Equal(t, http.StatusServiceUnavailable, get(t, h, http.MethodGet, challenge+randomToken()).StatusCode,
		"a well-formed token does need the database")
}

// A pending token is answered from memory: no query, however many requests.
func TestResponder_PendingTokenAnsweredFromMemory(t *testing.T) {
	t.Parallel()
	_, dsn := pgtest.NewPool(t)
	pool, counter := countedPool(t, dsn)
	r := startResponder(t, pool, acme.ResponderOptions{})
	token := randomToken()
	storeToken(t, pool, token, token+".thumb", time.Hour)
	require.Eventually(t, func() bool {
		return get(t, r, http.MethodGet, challenge+token).StatusCode == http.StatusOK
	}, 10*time.Second, 10*time.Millisecond)
	before := counter.count()
	for range 200 {
		resp := get(t, r, http.MethodGet, challenge+token)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, token+".thumb", body(t, resp))
	}
	require.Equal(t, before, counter.count(), "a token in memory cost a query")
}

// A token is answered only when the request's Host is the name it was issued for
// (certworker_http01_tokens.domain), whatever its case, port or trailing dot, both
// from memory (a started responder) and from the database (one that is not); any
// other Host is 404, counted as wrong_host. Guards against a responder that hands a
// name's key authorization to whoever reaches it under another name (a DNS
// rebinding, or a tenant's redirect from a name they do not own), which lego's own
// challenge server refuses.
func TestResponder_AnswersATokenOnlyForItsOwnName(t *testing.T) {
	t.Parallel()
	pool, _ := newTestPool(t)
	token := randomToken()
	_, err := pool.Exec(context.Background(), `
INSERT INTO certworker_http01_tokens (token, key_authorization, domain, expires_at)
VALUES ($1, $1 || '.shop', 'shop.example', now() + interval '1 hour')`, token)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	started := startResponder(t, pool, acme.ResponderOptions{Registerer: reg})
	for name, h := range map[string]http.Handler{"from memory": started, "from the database": acme.HTTP01Handler(pool, zap.NewNop())} {
		for _, host := range []string{"shop.example", "SHOP.Example", "shop.example.", "shop.example:80", "shop.example.:5002"} {
			resp := getAs(t, h, host, http.MethodGet, challenge+token)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s, Host %q", name, host)
			require.Equal(t, token+".shop", body(t, resp))
		}
		for _, host := range []string{"other.example", "", "shop.example.evil", "evil.shop.example", "127.0.0.1", "127.0.0.1:80", "shop", "[::1]:80"} {
			resp := getAs(t, h, host, http.MethodGet, challenge+token)
			require.Equal(t, http.StatusNotFound, resp.StatusCode, "%s, Host %q", name, host)
			require.NotContains(t, body(t, resp), token+".shop")
		}
	}
	var wrongHost float64
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == "certworker_http01_requests_total" && m.GetLabel()[0].GetValue() == "wrong_host" {
				wrongHost = m.GetCounter().GetValue()
			}
		}
	}
	require.Equal(t, 8.0, wrongHost, "the started responder's refusals")
}

// A plain INSERT (the preflight's probe, another instance's order) reaches every
// responder by notification, and a DELETE removes it, without a single look-up.
// Guards against a responder that only knows its own instance's tokens.
func TestResponder_NotificationReachesEveryResponder(t *testing.T) {
	t.Parallel()
	_, dsn := pgtest.NewPool(t)
	type instance struct {
		r       *acme.Responder
		counter *lookupCounter
	}
	var instances []instance
	for range 2 {
		pool, counter := countedPool(t, dsn)
		// A budget that is spent by the first miss: every later answer must come
		// from memory.
		r := startResponder(t, pool, acme.ResponderOptions{LookupsPerSecond: 1e-6, MissWait: 2 * time.Second})
		require.Equal(t, http.StatusNotFound, get(t, r, http.MethodGet, challenge+randomToken()).StatusCode)
		require.Equal(t, 1, counter.count())
		instances = append(instances, instance{r, counter})
	}
	writer, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(writer.Close)
	token := randomToken()
	storeToken(t, writer, token, token+".probe", time.Hour)
	for i, in := range instances {
		resp := get(t, in.r, http.MethodGet, challenge+token)
		require.Equal(t, http.StatusOK, resp.StatusCode, "instance %d", i)
		require.Equal(t, token+".probe", body(t, resp))
	}
	_, err = writer.Exec(context.Background(), `DELETE FROM certworker_http01_tokens WHERE token = $1`, token)
	require.NoError(t, err)
	for i, in := range instances {
		require.Eventually(t, func() bool {
			return get(t, in.r, http.MethodGet, challenge+token).StatusCode == http.StatusNotFound
		}, 10*time.Second, 10*time.Millisecond, "instance %d", i)
		require.Equal(t, 1, in.counter.count(), "instance %d looked a token up", i)
	}
}

// A token whose notification never came (stored with triggers off) is still found:
// a miss is looked up, and then held.
func TestResponder_MissIsLookedUp(t *testing.T) {
	t.Parallel()
	_, dsn := pgtest.NewPool(t)
	pool, counter := countedPool(t, dsn)
	r := startResponder(t, pool, acme.ResponderOptions{})
	token := randomToken()
	conn, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(context.Background(), `SET session_replication_role = replica`) // no triggers
	require.NoError(t, err)
	_, err = conn.Exec(context.Background(), `
INSERT INTO certworker_http01_tokens (token, key_authorization, domain, expires_at)
VALUES ($1, $1 || '.quiet', 'h.example', now() + interval '1 hour')`, token)
	require.NoError(t, err)

	resp := get(t, r, http.MethodGet, challenge+token)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, token+".quiet", body(t, resp))
	require.Equal(t, 1, counter.count())
	require.Equal(t, http.StatusOK, get(t, r, http.MethodGet, challenge+token).StatusCode)
	require.Equal(t, 1, counter.count(), "the token found is held")
}

// A flood of well-formed tokens costs the database at most 50 look-ups a second;
// every one is 404. Guards against a responder that turns the internet's noise into
// the proxy's database load.
func TestResponder_LookupsAreBounded(t *testing.T) {
	t.Parallel()
	_, dsn := pgtest.NewPool(t)
	pool, counter := countedPool(t, dsn)
	r := startResponder(t, pool, acme.ResponderOptions{MissWait: time.Millisecond})
	start := time.Now()
	var wg sync.WaitGroup
	var bad atomic.Int64
	for range 16 {
		wg.Go(func() {
			for range 40 {
				if get(t, r, http.MethodGet, challenge+randomToken()).StatusCode != http.StatusNotFound {
					bad.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	require.Zero(t, bad.Load())
	n := counter.count()
	require.Positive(t, n)
	require.LessOrEqual(t, float64(n), acme.DefaultLookupsPerSecond*elapsed.Seconds()+1,
		"%d look-ups in %s", n, elapsed)
	t.Logf("640 misses in %s: %d look-ups", elapsed, n)
}

// While the database cannot be reached, a token in memory is still answered and a
// miss is 503, never a 404 the CA would take as final.
func TestResponder_DatabaseLost(t *testing.T) {
	t.Parallel()
	_, dsn := pgtest.NewPool(t)
	proxy := newCutProxy(t, dsn)
	pool, err := pgxpool.New(context.Background(), proxy.dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	r := startResponder(t, pool, acme.ResponderOptions{})
	token := randomToken()
	storeToken(t, pool, token, token+".kept", time.Hour)
	require.Eventually(t, func() bool {
		return get(t, r, http.MethodGet, challenge+token).StatusCode == http.StatusOK
	}, 10*time.Second, 10*time.Millisecond)

	proxy.cut()
	require.Eventually(t, func() bool { return !r.Listening() }, 20*time.Second, 10*time.Millisecond)
	resp := get(t, r, http.MethodGet, challenge+token)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, token+".kept", body(t, resp))
	resp = get(t, r, http.MethodGet, challenge+randomToken())
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "service unavailable\n", body(t, resp))
}

// cutProxy forwards TCP to a test database until cut, after which every connection
// is closed and new ones are refused: a database that has gone away.
type cutProxy struct {
	dsn   string
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newCutProxy(t *testing.T, dsn string) *cutProxy {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	target := u.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	u.Host = ln.Addr().String()
	p := &cutProxy{dsn: u.String(), ln: ln}
	t.Cleanup(p.cut)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(s, c); s.Close() }()
			go func() { _, _ = io.Copy(c, s); c.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) cut() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}
