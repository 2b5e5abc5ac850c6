package acme_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
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
	"github.com/certworker/certworker/queue/issuing"
)

// frontConfig is an issuer configuration for the bed's CA seen through front.
func frontConfig(b *bed, front *pebbletest.Front) acme.Config {
	cfg := b.config()
	cfg.DirectoryURL = front.DirectoryURL
	return cfg
}

// A CA's rate limit comes back as *issuing.RateLimitError with its Retry-After and the
// reach of the limit its detail names, whether or not the body is a problem
// document, so that the worker pauses what the limit covers instead of charging the
// domain. The details are Let's Encrypt's own (pebbletest's answers). Guards against
// a rate limit retried with backoff by every domain at once, against a domain
// failed for the CA's limit, and against one tenant's limit pausing every tenant.
func TestIssue_RateLimitIsScopedRateLimitError(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	for _, tc := range []struct {
		name       string
		answer     func(name string) pebbletest.Answer
		wantAfter  time.Duration
		wantScope  string
		wantLimit  string
		wantDetail string
	}{
		{"new orders per account", func(string) pebbletest.Answer { return pebbletest.RateLimitedOrdersPerAccount(3 * time.Hour) },
			3 * time.Hour, issuing.ScopeCA, acme.LimitOrdersPerAccount, "too many new orders (300) from this account"},
		{"certificates per registered domain", func(n string) pebbletest.Answer { return pebbletest.RateLimitedRegisteredDomain(n, 7*24*time.Hour) },
			7 * 24 * time.Hour, issuing.ScopeRegisteredDomain, acme.LimitCertsPerRegisteredDomain, "too many certificates (50) already issued for"},
		{"certificates per exact set", func(string) pebbletest.Answer { return pebbletest.RateLimitedExactSet(34 * time.Hour) },
			34 * time.Hour, issuing.ScopeDomain, acme.LimitCertsPerExactSet, "this exact set of identifiers"},
		{"failed authorizations per name", func(n string) pebbletest.Answer { return pebbletest.RateLimitedFailedAuthorizations(n, 12*time.Minute) },
			12 * time.Minute, issuing.ScopeDomain, acme.LimitFailedAuthzPerName, "too many failed authorizations (5)"},
		{"problem document of another type on HTTP 429, Retry-After", func(string) pebbletest.Answer {
			return pebbletest.Answer{Status: http.StatusTooManyRequests, RetryAfter: 7 * time.Second,
				Problem: &pebbletest.Problem{Type: "urn:ietf:params:acme:error:serverInternal", Detail: "slow down"}}
		}, 7 * time.Second, issuing.ScopeCA, "", "slow down"},
		{"HTML 429 without Retry-After", func(string) pebbletest.Answer {
			return pebbletest.Answer{Status: http.StatusTooManyRequests, ContentType: "text/html", Body: "<html>Too Many Requests</html>"}
		}, 0, issuing.ScopeCA, "", "429"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			front := pebbletest.NewFront(t, b.ca)
			name := randomName("l")
			front.Add(pebbletest.Rule{Step: pebbletest.StepNewOrder, Names: []string{name}, Answer: tc.answer(name)})
			_, err := newIssuer(t, b.pool, nil, frontConfig(b, front)).Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: name})
			rl, ok := issuing.IsRateLimit(err)
			require.True(t, ok, "want a RateLimitError, got %T: %v", err, err)
			require.InDelta(t, tc.wantAfter.Seconds(), rl.RetryAfter.Seconds(), 2)
			require.Equal(t, tc.wantScope, rl.Scope)
			require.Equal(t, tc.wantLimit, rl.Limit)
			require.Contains(t, rl.Error(), tc.wantDetail)
			require.Equal(t, 1, front.Answered()[pebbletest.StepNewOrder])
		})
	}
}

// A CA that cannot be reached at some step of an order (no connection, a reset, a
// request that times out) or answers 5xx is *issuing.CAUnavailableError, which the
// worker does not charge to the domain. Each row breaks one step of a first order
// (a fresh issuer and database: the order fetches the directory and a nonce and
// registers the account) and leaves the rest to Pebble. Guards against an outage
// of the CA failing every pending domain, one attempt per try.
func TestIssue_CAUnreachableOrFailingAtAnyStepIsCAUnavailable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		step   pebbletest.Step
		answer pebbletest.Answer
		times  int
		want   string
	}{
		{pebbletest.StepDirectory, pebbletest.Dropped(), 0, "GET"},
		{pebbletest.StepNonce, pebbletest.Dropped(), 0, "HEAD"},
		{pebbletest.StepNewAccount, pebbletest.Dropped(), 1, "POST"},
		{pebbletest.StepNewOrder, pebbletest.Dropped(), 1, "POST"},
		{pebbletest.StepAuthorization, pebbletest.Dropped(), 1, "POST"},
		{pebbletest.StepChallenge, pebbletest.Dropped(), 1, "POST"},
		{pebbletest.StepFinalize, pebbletest.Dropped(), 1, "POST"},
		{pebbletest.StepOrder, pebbletest.Dropped(), 1, "POST"},
		{pebbletest.StepCertificate, pebbletest.Dropped(), 1, "POST"},
		{pebbletest.StepDirectory, pebbletest.Unavailable(http.StatusBadGateway), 0, "502 Bad Gateway"},
		{pebbletest.StepNewOrder, pebbletest.Unavailable(http.StatusServiceUnavailable), 1, "503 Service Unavailable"},
		{pebbletest.StepFinalize, pebbletest.ServerInternal(), 1, "serverInternal"},
		{pebbletest.StepChallenge, pebbletest.Unavailable(http.StatusGatewayTimeout), 1, "504 Gateway Timeout"},
		{pebbletest.StepAuthorization, pebbletest.TimedOut(), 1, "no answer in time"},
		{pebbletest.StepCertificate, pebbletest.TimedOut(), 1, "no answer in time"},
	} {
		name := string(tc.step) + " " + tc.want
		if tc.answer.Drop {
			name = string(tc.step) + " dropped"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, pebbletest.Options{}, true)
			front := pebbletest.NewFront(t, b.ca)
			front.Add(pebbletest.Rule{Step: tc.step, Times: tc.times, Answer: tc.answer})
			cfg := frontConfig(b, front)
			cfg.HTTPTimeout = time.Second
			start := time.Now()
			_, err := newIssuer(t, b.pool, nil, cfg).Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: randomName("d")})
			var ue *issuing.CAUnavailableError
			require.ErrorAs(t, err, &ue, "%T: %v", err, err)
			require.Contains(t, err.Error(), tc.want)
			require.NotZero(t, front.Answered()[tc.step], "the rule must have been reached")
			require.False(t, issuing.IsAuthorizationFailure(err))
			require.Less(t, time.Since(start), 15*time.Second)
		})
	}
}

// The CA stopped (nothing listens any more) is *issuing.CAUnavailableError for an
// issuer that never reached it and for one that has its directory and nonces
// already. Guards against the shared directory hiding an outage, or turning it into
// an error charged to the domain.
func TestIssue_CAStoppedIsCAUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	warm := newIssuer(t, b.pool, nil, b.config())
	_, err := warm.Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: randomName("s")})
	require.NoError(t, err)
	pool, _ := newTestPool(t)
	cold := newIssuer(t, pool, nil, b.config())
	require.NoError(t, b.ca.Close())

	for name, iss := range map[string]*acme.Issuer{"warm": warm, "cold": cold} {
		_, err := iss.Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: randomName("s")})
		var ue *issuing.CAUnavailableError
		require.ErrorAs(t, err, &ue, "%s: %T: %v", name, err, err)
		require.Contains(t, err.Error(), "connection refused", name)
	}
}

// A CA answering garbage (not ACME, not 5xx) fails the order with a plain error
// charged to the domain, in bounded time, without a panic. Guards against a panic
// on an unexpected answer taking the worker down, and a CA's garbage filling
// ssl_error.
func TestIssue_CAAnsweringGarbageIsPlainError(t *testing.T) {
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
	}{
		{name: "directory not JSON", dir: garbage(func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte("<html>hello</html>"))
		})},
		{name: "directory empty object", dir: garbage(func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte("{}"))
		})},
		{name: "client error with a huge body", dir: garbage(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(strings.Repeat("x", 5<<20)))
		})},
		{name: "endpoints answering junk JSON", dir: garbage(jsonGarbage)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, _ := newTestPool(t)
			cfg := b.config()
			cfg.DirectoryURL = tc.dir
			cfg.Profile = "" // these CAs list no profiles: an order naming one is refused before they see it
			cfg.HTTPTimeout = 2 * time.Second
			iss := newIssuer(t, pool, nil, cfg)
			start := time.Now()
			_, err := iss.Issue(testCtx(t, time.Minute), issuing.Request{Domain: randomName("g")})
			require.Less(t, time.Since(start), 20*time.Second)
			require.Error(t, err)
			_, isRL := issuing.IsRateLimit(err)
			require.False(t, isRL, "not a rate limit: %v", err)
			var ue *issuing.CAUnavailableError
			require.False(t, errors.As(err, &ue), "not unavailable: %v", err)
			require.True(t, strings.HasPrefix(err.Error(), "acme: "), "error %q", err)
			require.LessOrEqual(t, len(err.Error()), 1000, "error messages are bounded")
			require.Zero(t, registeredAccounts(t, pool), "no account stored for a CA that did not register it")
		})
	}
}

// A challenge the CA cannot validate fails with the CA's problem type in the error,
// which is what the operator reads in ssl_error; it is charged (a 4xx problem about
// the domain) and counts as a failed authorization. Guards against a generic "order
// failed" that says nothing of why, a token left in the table, and a failed
// validation missing from the ledger that mirrors the CA's limit on them.
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
			_, err := newIssuer(t, b.pool, nil, b.config()).Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: randomName("v")})
			require.Error(t, err)
			e, ok := asAcmeError(err)
			require.True(t, ok, "want *acme.Error, got %T: %v", err, err)
			require.Equal(t, tc.wantType, e.Type)
			require.True(t, strings.HasPrefix(err.Error(), "acme: "+tc.wantType+": "), "error %q", err)
			require.True(t, issuing.IsAuthorizationFailure(err), "a failed validation feeds the ledger's failed-authorizations limit")
			var ue *issuing.CAUnavailableError
			var pe *issuing.PermanentError
			require.False(t, errors.As(err, &ue) || errors.As(err, &pe), "charged and retried: %T", err)
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
	// A CA that never answers the order.
	front := pebbletest.NewFront(t, b.ca)
	front.Add(pebbletest.Rule{Step: pebbletest.StepNewOrder, Answer: pebbletest.Answer{Stall: 20 * time.Second}})
	cfg := frontConfig(b, front)
	cfg.HTTPTimeout = time.Minute
	iss := newIssuer(t, b.pool, nil, cfg)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := iss.Issue(ctx, issuing.Request{Domain: randomName("x")})
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
	front := pebbletest.NewFront(t, b.ca)
	front.Add(pebbletest.Rule{Answer: pebbletest.Unavailable(http.StatusServiceUnavailable)})
	iss := newIssuer(t, b.pool, nil, frontConfig(b, front))

	_, err := iss.Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: randomName("w")})
	require.Error(t, err)
	require.Zero(t, registeredAccounts(t, b.pool))

	front.Clear()
	_, err = iss.Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: randomName("w")})
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

	_, err := iss.Issue(ctx, issuing.Request{Domain: randomName("f")})
	require.NoError(t, err)

	// The CA behind the URL is reset: a new Pebble that knows no account.
	reset := proxyHandler(t, second)
	backend.Store(&reset)
	_, err = iss.Issue(ctx, issuing.Request{Domain: randomName("f")})
	require.Error(t, err)
	require.Contains(t, err.Error(), "urn:ietf:params:acme:error:accountDoesNotExist")
	require.Zero(t, countRows(t, b.pool, "certworker_acme_accounts"), "the unknown account must be forgotten")

	_, err = iss.Issue(ctx, issuing.Request{Domain: randomName("f")})
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
	base := acme.Config{DirectoryURL: ca.DirectoryURL, CABundle: ca.RootsFile, Recorder: queue.New(pool, issuing.DefaultConfig())}
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
		{"profile", func(c *acme.Config) { c.Profile = "short lived" }, "--acme-profile", ""},
		{"no recorder", func(c *acme.Config) { c.Recorder = nil }, "nil Recorder", ""},
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
