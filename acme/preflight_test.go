package acme_test

import (
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue"
)

// preflightConfig is the bed's configuration with --preflight http, asking the DNS
// the CA validates with, and probing the port it validates on.
func preflightConfig(b *bed) acme.Config {
	cfg := b.config()
	cfg.Preflight = acme.PreflightHTTP
	cfg.PreflightResolver = b.ca.DNSServer
	cfg.PreflightPort = b.ca.HTTPPort
	return cfg
}

// serveAt answers h on ip at the bed's HTTP-01 port (another host of the same
// name, as far as the DNS says) until the test ends.
func (b *bed) serveAt(t *testing.T, ip string, h http.Handler) {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(b.ca.HTTPPort)))
	require.NoError(t, err)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// pointAt makes name resolve to ip for the test.
func pointAt(t *testing.T, name, ip string) {
	t.Helper()
	require.NoError(t, pebbletest.SetA(name, ip))
	t.Cleanup(func() { pebbletest.ClearDNS(name) })
}

// The preflight sees what the CA's validation will see, and when that would fail,
// sends nothing to the CA and says what it saw, as ssl_error will: a name whose DNS
// still points at the tenant's old host (another HTTP server), at an address
// where nothing listens, or nowhere; a DNS server failing for the name; a redirect
// the CA would not follow. A healthy name, and one that redirects to it the way the
// CA follows, pass and are issued. The probe token is stored like a challenge's and
// deleted after. Guards against orders the CA is bound to fail (each one spends the
// CA's failed-validation limit for the name, and LE pauses the name after many),
// and against a preflight that blocks names the CA would validate.
func TestIssue_PreflightSendsNothingToTheCAForANameItWouldFail(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// arrange points the name somewhere; nil leaves it at the responder.
		arrange func(t *testing.T, b *bed, name string)
		// want is the PreflightError's message, with NAME and PORT replaced; ""
		// is a name that passes and is issued.
		want string
	}{
		{name: "healthy name"},
		{name: "DNS still points at the old host", arrange: func(t *testing.T, b *bed, name string) {
			pointAt(t, name, "127.0.0.2")
			b.serveAt(t, "127.0.0.2", http.NotFoundHandler())
		}, want: "preflight: answered by something else at 127.0.0.2:PORT: HTTP 404 Not Found"},
		{name: "old host answers 200 with its own page", arrange: func(t *testing.T, b *bed, name string) {
			pointAt(t, name, "127.0.0.2")
			b.serveAt(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				_, _ = w.Write([]byte("<html>welcome to nginx</html>"))
			}))
		}, want: "preflight: answered by something else at 127.0.0.2:PORT: HTTP 200 OK with a body that is not the probe token"},
		{name: "nothing listens at the address", arrange: func(t *testing.T, b *bed, name string) {
			pointAt(t, name, "127.0.0.3")
		}, want: "preflight: no answer at 127.0.0.3:PORT: connection refused"},
		{name: "name does not resolve", arrange: func(t *testing.T, b *bed, name string) {
			require.NoError(t, pebbletest.SetNoAddress(name))
			t.Cleanup(func() { pebbletest.ClearDNS(name) })
		}, want: "preflight: no such name: NAME does not resolve to an address"},
		{name: "DNS server fails for the name", arrange: func(t *testing.T, b *bed, name string) {
			require.NoError(t, pebbletest.SetServFail(name))
			t.Cleanup(func() { pebbletest.ClearDNS(name) })
		}, want: "preflight: DNS lookup of NAME failed: server misbehaving"},
		{name: "redirect to a port the CA does not follow", arrange: func(t *testing.T, b *bed, name string) {
			pointAt(t, name, "127.0.0.2")
			b.serveAt(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, "http://"+name+":8080"+r.URL.Path, http.StatusFound)
			}))
		}, want: "preflight: redirected to http://NAME:8080/.well-known/acme-challenge/"},
		{name: "redirect the CA follows, to the responder", arrange: func(t *testing.T, b *bed, name string) {
			pointAt(t, name, "127.0.0.2")
			healthy := randomName("h")
			b.serveAt(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, "http://"+healthy+":"+strconv.Itoa(b.ca.HTTPPort)+r.URL.Path, http.StatusMovedPermanently)
			}))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, pebbletest.Options{}, true)
			name := randomName("f")
			if tc.arrange != nil {
				tc.arrange(t, b, name)
			}
			cert, err := newIssuer(t, b.pool, nil, preflightConfig(b)).Issue(testCtx(t, 30*time.Second), queue.Request{Domain: name})
			require.Zero(t, countRows(t, b.pool, "certworker_http01_tokens"), "the probe token is deleted")
			if tc.want == "" {
				require.NoError(t, err)
				require.NoError(t, parseChain(t, cert.ChainPEM)[0].VerifyHostname(name))
				require.Equal(t, 1, b.ca.OrderRequests())
				return
			}
			var pe *queue.PreflightError
			require.ErrorAs(t, err, &pe, "%T: %v", err, err)
			want := strings.NewReplacer("NAME", name, "PORT", strconv.Itoa(b.ca.HTTPPort)).Replace(tc.want)
			require.True(t, strings.HasPrefix(err.Error(), want), "error %q, want %q", err, want)
			require.Empty(t, b.ca.Requests(), "nothing is sent to the CA, not even for its directory")
			var ue *queue.CAUnavailableError
			require.False(t, errors.As(err, &ue))
		})
	}
}

// --preflight off orders without probing: a name pointing at another host reaches
// the CA (which fails its validation). Guards against a preflight that cannot be
// turned off for a deployment where the worker cannot see what the CA sees.
func TestIssue_PreflightOffOrdersWithoutProbing(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	name := randomName("o")
	pointAt(t, name, "127.0.0.3")
	cfg := preflightConfig(b)
	cfg.Preflight = acme.PreflightOff
	_, err := newIssuer(t, b.pool, nil, cfg).Issue(testCtx(t, 30*time.Second), queue.Request{Domain: name})
	e, ok := asAcmeError(err)
	require.True(t, ok, "the CA's own verdict: %T: %v", err, err)
	require.Equal(t, "urn:ietf:params:acme:error:connection", e.Type)
	require.Equal(t, 1, b.ca.OrderRequests())
}
