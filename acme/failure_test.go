package acme_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue"
)

// proxyTo is a reverse proxy to the CA that lets intercept answer first: a CA
// misbehaving on some requests only. Pebble builds its URLs from the Host header,
// which the proxy keeps, so every URL the client follows comes back through it.
func proxyTo(t *testing.T, ca *pebbletest.CA, intercept func(w http.ResponseWriter, r *http.Request) bool) string {
	t.Helper()
	target, err := url.Parse(ca.DirectoryURL)
	require.NoError(t, err)
	target.Path = ""
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(ca.RootsPEM()))
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
	srv := ca.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if intercept(w, r) {
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + pebbletest.DirectoryPath
}

// A CA's rate limit must come back as *queue.RateLimitError with its Retry-After,
// whether or not the body is a problem document: the worker then pauses the CA for
// every instance instead of charging the domain an attempt. Guards against a rate
// limit being retried with backoff by every domain at once (which keeps the CA
// answering 429) and against a failed domain that did nothing wrong.
func TestIssue_RateLimitIsRateLimitError(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	for _, tc := range []struct {
		name        string
		contentType string
		body        string
		retryAfter  func() string
		wantAfter   time.Duration
		wantDetail  string
	}{
		{
			name:        "problem document with Retry-After",
			contentType: "application/problem+json",
			body:        `{"type":"urn:ietf:params:acme:error:rateLimited","detail":"too many certificates for this name","status":429}`,
			retryAfter:  func() string { return "7" },
			wantAfter:   7 * time.Second,
			wantDetail:  "too many certificates for this name",
		},
		{
			name:        "problem document of another type on HTTP 429, Retry-After as a date",
			contentType: "application/problem+json",
			body:        `{"type":"urn:ietf:params:acme:error:serverInternal","detail":"slow down"}`,
			retryAfter: func() string {
				return time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)
			},
			wantAfter:  time.Hour,
			wantDetail: "slow down",
		},
		{
			name:        "HTML 429 without Retry-After",
			contentType: "text/html",
			body:        "<html>Too Many Requests</html>",
			wantAfter:   0,
			wantDetail:  "429",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := proxyTo(t, b.ca, func(w http.ResponseWriter, r *http.Request) bool {
				if r.Method != http.MethodPost || r.URL.Path != pebbletest.NewOrderPath {
					return false
				}
				w.Header().Set("Content-Type", tc.contentType)
				if tc.retryAfter != nil {
					w.Header().Set("Retry-After", tc.retryAfter())
				}
				w.WriteHeader(http.StatusTooManyRequests)
				_, _ = w.Write([]byte(tc.body))
				return true
			})
			cfg := b.config()
			cfg.DirectoryURL = dir
			_, err := newIssuer(t, b.pool, nil, cfg).Issue(testCtx(t, 30*time.Second), queue.Request{Domain: randomName("l")})
			rl, ok := queue.IsRateLimit(err)
			require.True(t, ok, "want a RateLimitError, got %T: %v", err, err)
			require.InDelta(t, tc.wantAfter.Seconds(), rl.RetryAfter.Seconds(), 2)
			require.Contains(t, rl.Error(), tc.wantDetail)
		})
	}
}

// A CA that is down, or answers garbage, fails the order with a plain error, in
// bounded time, without a panic. Guards against a worker slot hung on a dead CA, a
// panic on an unexpected answer taking the worker down, and a CA's garbage filling
// ssl_error.
func TestIssue_CADownOrAnsweringGarbageIsPlainError(t *testing.T) {
	t.Parallel()
	ca := pebbletest.StartT(t, pebbletest.Options{})
	b := &bed{ca: ca}
	var nonce atomic.Int64
	nextNonce := func() string { return "nonce-" + strconv.FormatInt(nonce.Add(1), 10) }
	garbage := func(handler http.HandlerFunc) string {
		srv := ca.NewTLSServer(handler)
		t.Cleanup(srv.Close)
		return srv.URL + "/dir"
	}
	// A directory that looks right, and endpoints that answer junk.
	var jsonGarbage http.HandlerFunc = func(w http.ResponseWriter, r *http.Request) {
		base := "https://" + r.Host
		w.Header().Set("Replay-Nonce", nextNonce())
		switch r.URL.Path {
		case "/dir":
			_, _ = w.Write([]byte(`{"newNonce":"` + base + `/nonce","newAccount":"` + base + `/acct","newOrder":"` + base + `/order"}`))
		case "/nonce":
			w.WriteHeader(http.StatusOK)
		default:
			w.Header().Set("Location", base+"/acct/1")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"status": [1,2,3}`))
		}
	}
	for _, tc := range []struct {
		name string
		dir  string
		// within is how long the order may take.
		within time.Duration
	}{
		{name: "nothing listening", dir: "https://127.0.0.1:" + closedPort(t) + "/dir", within: 10 * time.Second},
		{name: "directory not JSON", dir: garbage(func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte("<html>hello</html>"))
		}), within: 10 * time.Second},
		{name: "directory empty object", dir: garbage(func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte("{}"))
		}), within: 10 * time.Second},
		{name: "server error with a huge body", dir: garbage(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(strings.Repeat("x", 5<<20)))
		}), within: 10 * time.Second},
		{name: "endpoints answering junk JSON", dir: garbage(jsonGarbage), within: 20 * time.Second},
		{name: "directory that never answers", dir: garbage(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(time.Minute):
			}
		}), within: 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, _ := newTestPool(t)
			cfg := b.config()
			cfg.DirectoryURL = tc.dir
			cfg.HTTPTimeout = 2 * time.Second
			iss := newIssuer(t, pool, nil, cfg)
			start := time.Now()
			_, err := iss.Issue(testCtx(t, time.Minute), queue.Request{Domain: randomName("g")})
			require.Less(t, time.Since(start), tc.within)
			require.Error(t, err)
			_, isRL := queue.IsRateLimit(err)
			require.False(t, isRL, "not a rate limit: %v", err)
			require.True(t, strings.HasPrefix(err.Error(), "acme: "), "error %q", err)
			require.LessOrEqual(t, len(err.Error()), 1000, "error messages are bounded")
			require.Zero(t, countRows(t, pool, "certworker_acme_accounts"), "no account stored for a CA that did not register it")
		})
	}
}

// A challenge the CA cannot validate fails with the CA's problem type in the error,
// which is what the operator reads in ssl_error. Guards against a generic "order
// failed" that says nothing of why, and against a token left in the table.
func TestIssue_ValidationFailureReportsProblemType(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		serve    bool
		wantType string
	}{
		{name: "responder without the token", serve: true, wantType: "urn:ietf:params:acme:error:unauthorized"},
		{name: "no responder at all", serve: false, wantType: "urn:ietf:params:acme:error:connection"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, pebbletest.Options{}, false)
			if tc.serve {
				b.serve(t, http.NotFoundHandler())
			} else {
				_ = b.ln.Close()
			}
			_, err := newIssuer(t, b.pool, nil, b.config()).Issue(testCtx(t, 30*time.Second), queue.Request{Domain: randomName("v")})
			require.Error(t, err)
			e, ok := asAcmeError(err)
			require.True(t, ok, "want *acme.Error, got %T: %v", err, err)
			require.Equal(t, tc.wantType, e.Type)
			require.True(t, strings.HasPrefix(err.Error(), "acme: "+tc.wantType+": "), "error %q", err)
			require.Zero(t, countRows(t, b.pool, "certworker_http01_tokens"), "the token must be deleted after a failed challenge")
		})
	}
}

// The worker cancels an order whose claim it lost and at the end of the shutdown
// grace; Issue must return then, even though lego's calls take no context. Guards
// against shutdown waiting on a CA that does not answer.
func TestIssue_ReturnsPromptlyWhenCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	dir := proxyTo(t, b.ca, func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != pebbletest.NewOrderPath {
			return false
		}
		// A CA that never answers the order. The body is read first: until it is,
		// net/http does not notice the client going away.
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-time.After(20 * time.Second):
		}
		return true
	})
	cfg := b.config()
	cfg.DirectoryURL = dir
	cfg.HTTPTimeout = time.Minute
	iss := newIssuer(t, b.pool, nil, cfg)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := iss.Issue(ctx, queue.Request{Domain: randomName("x")})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 4*time.Second)
}

// A CA that is down when the worker starts must not stop it: New does not contact
// the CA, the order fails, and the first order after the CA is back registers the
// account. Guards against an account registered at start (the worker would exit, or
// never register) and against a failed registration remembered as an account.
func TestIssue_RegistersAccountOnceCAComesBack(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	var up atomic.Bool
	dir := proxyTo(t, b.ca, func(w http.ResponseWriter, r *http.Request) bool {
		if up.Load() {
			return false
		}
		http.Error(w, "maintenance", http.StatusServiceUnavailable)
		return true
	})
	cfg := b.config()
	cfg.DirectoryURL = dir
	iss := newIssuer(t, b.pool, nil, cfg)

	_, err := iss.Issue(testCtx(t, 30*time.Second), queue.Request{Domain: randomName("w")})
	require.Error(t, err)
	require.Zero(t, countRows(t, b.pool, "certworker_acme_accounts"))

	up.Store(true)
	_, err = iss.Issue(testCtx(t, 30*time.Second), queue.Request{Domain: randomName("w")})
	require.NoError(t, err)
	require.Equal(t, 1, countRows(t, b.pool, "certworker_acme_accounts"))
}

// A CA that lost the account (reset, or the account deactivated) answers
// accountDoesNotExist; the issuer forgets the stored account so that the next order
// registers a new one. Guards against a worker failing every order for ever after a
// CA reset.
func TestIssue_ForgetsAccountTheCADoesNotKnow(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	second := pebbletest.StartT(t, pebbletest.Options{HTTPPort: b.ca.HTTPPort})
	var backend atomic.Pointer[http.Handler]
	first := proxyHandler(t, b.ca)
	backend.Store(&first)
	srv := b.ca.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		(*backend.Load()).ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	cfg := b.config()
	cfg.DirectoryURL = srv.URL + pebbletest.DirectoryPath
	iss := newIssuer(t, b.pool, nil, cfg)
	ctx := testCtx(t, 30*time.Second)

	_, err := iss.Issue(ctx, queue.Request{Domain: randomName("f")})
	require.NoError(t, err)

	// The CA behind the URL is reset: a new Pebble that knows no account.
	reset := proxyHandler(t, second)
	backend.Store(&reset)
	_, err = iss.Issue(ctx, queue.Request{Domain: randomName("f")})
	require.Error(t, err)
	require.Contains(t, err.Error(), "urn:ietf:params:acme:error:accountDoesNotExist")
	require.Zero(t, countRows(t, b.pool, "certworker_acme_accounts"), "the unknown account must be forgotten")

	_, err = iss.Issue(ctx, queue.Request{Domain: randomName("f")})
	require.NoError(t, err)
	require.Equal(t, 1, second.NewAccounts())
}

// proxyHandler forwards to ca, keeping the Host header (see proxyTo).
func proxyHandler(t *testing.T, ca *pebbletest.CA) http.Handler {
	t.Helper()
	target, err := url.Parse(ca.DirectoryURL)
	require.NoError(t, err)
	target.Path = ""
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(ca.RootsPEM()))
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
	return rp
}

// Config errors name the flag to fix, and never echo a secret. Guards against an
// operator left guessing which of a dozen flags is wrong.
func TestNew_ConfigErrorsNameTheFlag(t *testing.T) {
	t.Parallel()
	pool, _ := newTestPool(t)
	ca := pebbletest.StartT(t, pebbletest.Options{})
	base := acme.Config{DirectoryURL: ca.DirectoryURL, CABundle: ca.RootsFile}
	notPEM := t.TempDir() + "/not.pem"
	require.NoError(t, writeFile(notPEM, "hello"))
	for _, tc := range []struct {
		name    string
		mutate  func(c *acme.Config)
		want    string
		notWant string
	}{
		{"key type", func(c *acme.Config) { c.KeyType = "ed25519" }, "--key-type", ""},
		{"bundle missing", func(c *acme.Config) { c.CABundle = "/nonexistent/roots.pem" }, "--acme-ca-bundle", ""},
		{"bundle not PEM", func(c *acme.Config) { c.CABundle = notPEM }, "--acme-ca-bundle", ""},
		{"kid without hmac", func(c *acme.Config) { c.EABKeyID = "kid" }, "--acme-eab-hmac", ""},
		{"hmac without kid", func(c *acme.Config) { c.EABHMAC = "c2VjcmV0" }, "--acme-eab-kid", "c2VjcmV0"},
		{"hmac not base64url", func(c *acme.Config) { c.EABKeyID, c.EABHMAC = "kid", "not base64 !!secret" }, "--acme-eab-hmac", "secret"},
		{"key encryption key size", func(c *acme.Config) { c.KeyEncryptionKeys = [][]byte{make([]byte, 16)} }, "--key-encryption-key", ""},
		{"directory not https", func(c *acme.Config) { c.DirectoryURL = "http://127.0.0.1/dir" }, "--acme-directory", ""},
		{"directory missing", func(c *acme.Config) { c.DirectoryURL = "" }, "--acme-directory", ""},
		{"email", func(c *acme.Config) { c.Email = "not an email" }, "--acme-email", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := base
			tc.mutate(&cfg)
			_, err := acme.New(context.Background(), pool, nil, cfg)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
			if tc.notWant != "" {
				require.NotContains(t, err.Error(), tc.notWant, "the error must not echo the secret")
			}
		})
	}
	_, err := acme.New(context.Background(), pool, nil, base)
	require.NoError(t, err, "a valid configuration")
}
