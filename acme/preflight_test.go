package acme_test

import (
	"errors"
	"net"
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
	"github.com/certworker/certworker/queue/issuing"
)

// preflightConfig is the bed's configuration with --preflight http, asking the DNS
// the CA validates with, and probing the port it validates on. Everything here
// listens on loopback, which the preflight refuses unless allowed.
func preflightConfig(b *bed) acme.Config {
	cfg := b.config()
	cfg.Preflight = acme.PreflightHTTP
	cfg.PreflightResolver = b.ca.DNSServer
	cfg.PreflightPort = b.ca.HTTPPort
	cfg.PreflightAllowCIDR = "127.0.0.0/8"
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

// pointAt makes name resolve to the ips for the test.
func pointAt(t *testing.T, name string, ips ...string) {
	t.Helper()
	require.NoError(t, pebbletest.SetA(name, ips...))
	t.Cleanup(func() { pebbletest.ClearDNS(name) })
}

// countConns listens on ip at the bed's HTTP-01 port, answers with h, and counts the
// connections it accepts.
func (b *bed) countConns(t *testing.T, ip string, h http.Handler) *atomic.Int32 {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(b.ca.HTTPPort)))
	require.NoError(t, err)
	n := &atomic.Int32{}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ConnState: func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			n.Add(1)
		}
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return n
}

// The preflight never connects to a reserved address (loopback, private, link-local,
// ...) that --preflight-allow-cidr does not allow: not when the name resolves there,
// not when one of its answers does, not when a redirect leads to a name or an address
// there. ssl_error names the tenant's own name and its addresses, never an address
// resolved for a redirect's host: a redirect's host that resolves to a reserved
// address and one that does not resolve at all get the same words, and a redirect to
// an IP literal or a single label is refused by the name rules before any look-up.
// Nothing reaches the CA. Guards against tenants using the worker to probe the
// operator's network (its own admin port, the cloud's metadata service, the database)
// or to read what the operator's resolver says of internal names.
func TestIssue_PreflightNeverConnectsToAReservedAddress(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		allow string
		// arrange points the name, and a redirect's target, and returns the
		// listeners that must see no connection.
		arrange func(t *testing.T, b *bed, name, other string) []*atomic.Int32
		// want is the whole error, with NAME and OTHER replaced.
		want string
	}{
		{name: "the name resolves to loopback", arrange: func(t *testing.T, b *bed, name, _ string) []*atomic.Int32 {
			pointAt(t, name, "127.0.0.2")
			return []*atomic.Int32{b.countConns(t, "127.0.0.2", http.NotFoundHandler())}
		}, want: "preflight: NAME resolves to a reserved address (127.0.0.2)"},
		{name: "one answer of two is reserved", allow: "127.0.0.2/32", arrange: func(t *testing.T, b *bed, name, _ string) []*atomic.Int32 {
			pointAt(t, name, "127.0.0.2", "127.0.0.3")
			return []*atomic.Int32{b.countConns(t, "127.0.0.2", http.NotFoundHandler()), b.countConns(t, "127.0.0.3", http.NotFoundHandler())}
		}, want: "preflight: NAME resolves to a reserved address (127.0.0.3)"},
		{name: "a redirect to a name that resolves to loopback", allow: "127.0.0.2/32", arrange: func(t *testing.T, b *bed, name, other string) []*atomic.Int32 {
			pointAt(t, name, "127.0.0.2")
			pointAt(t, other, "127.0.0.3")
			b.serveAt(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, "http://"+other+":"+strconv.Itoa(b.ca.HTTPPort)+r.URL.Path, http.StatusFound)
			}))
			return []*atomic.Int32{b.countConns(t, "127.0.0.3", http.NotFoundHandler())}
		}, want: "preflight: NAME redirects to OTHER, which has no public address the CA could reach"},
		{name: "a redirect to a name that does not resolve", allow: "127.0.0.2/32", arrange: func(t *testing.T, b *bed, name, other string) []*atomic.Int32 {
			pointAt(t, name, "127.0.0.2")
			b.serveAt(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, "http://"+other+":"+strconv.Itoa(b.ca.HTTPPort)+r.URL.Path, http.StatusFound)
			}))
			return nil
		}, want: "preflight: NAME redirects to OTHER, which has no public address the CA could reach"},
		{name: "a redirect to a single label", allow: "127.0.0.2/32", arrange: func(t *testing.T, b *bed, name, _ string) []*atomic.Int32 {
			pointAt(t, name, "127.0.0.2")
			b.serveAt(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Location", "http://internaldb/x")
				w.WriteHeader(http.StatusFound)
			}))
			return nil
		}, want: "preflight: redirected to http://internaldb/x, which the CA does not follow: not a public host name: a single label; a public name has at least two"},
		{name: "a redirect to a loopback address", allow: "127.0.0.2/32", arrange: func(t *testing.T, b *bed, name, _ string) []*atomic.Int32 {
			pointAt(t, name, "127.0.0.2")
			b.serveAt(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, "http://127.0.0.3:"+strconv.Itoa(b.ca.HTTPPort)+"/x", http.StatusFound)
			}))
			return []*atomic.Int32{b.countConns(t, "127.0.0.3", http.NotFoundHandler())}
		}, want: "preflight: redirected to http://127.0.0.3:PORT/x, which the CA does not follow: not a public host name: an IP address, not a host name"},
		{name: "a redirect to the cloud's metadata service", allow: "127.0.0.2/32", arrange: func(t *testing.T, b *bed, name, _ string) []*atomic.Int32 {
			pointAt(t, name, "127.0.0.2")
			b.serveAt(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/", http.StatusFound)
			}))
			return nil
		}, want: "preflight: redirected to http://169.254.169.254/latest/meta-data/, which the CA does not follow: not a public host name: an IP address, not a host name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, pebbletest.Options{}, true)
			name, other := randomName("r"), randomName("o")
			untouched := tc.arrange(t, b, name, other)
			cfg := preflightConfig(b)
			cfg.PreflightAllowCIDR = tc.allow
			_, err := newIssuer(t, b.pool, nil, cfg).Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: name})
			var pe *issuing.PreflightError
			require.ErrorAs(t, err, &pe, "%T: %v", err, err)
			require.Equal(t, strings.NewReplacer("NAME", name, "OTHER", other, "PORT", strconv.Itoa(b.ca.HTTPPort)).Replace(tc.want), pe.Error())
			if strings.Contains(tc.want, "OTHER") {
				require.NotContains(t, pe.Error(), "127.0.0.3", "ssl_error shows an address resolved for a redirect's host")
			}
			for i, n := range untouched {
				require.Zero(t, n.Load(), "listener %d was connected to", i)
			}
			require.Empty(t, b.ca.Requests(), "nothing is sent to the CA")
			require.Zero(t, countRows(t, b.pool, "certworker_http01_tokens"), "the probe token is deleted")
		})
	}
}

// What a preflight says never quotes what the probed server sent: not its body, not
// its status line's reason phrase, not the bytes of an answer that is not HTTP (an
// SSH banner), not a redirect's query. The status code, the address and the
// redirect's host and path are enough to act on. Guards against ssl_error, which the
// tenant reads, carrying what a server the preflight reached told it.
func TestIssue_PreflightErrorNeverQuotesTheProbedServer(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-from-the-server"
	for _, tc := range []struct {
		name  string
		serve func(t *testing.T, b *bed, name string)
		want  string
	}{
		{name: "a 200 whose body is not the token", serve: func(t *testing.T, b *bed, _ string) {
			b.serveAt(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				_, _ = w.Write([]byte(secret))
			}))
		}, want: "preflight: answered by something else at 127.0.0.2:PORT: HTTP 200 OK with a body that is not the probe token"},
		{name: "a reason phrase of its own", serve: func(t *testing.T, b *bed, _ string) {
			rawServer(t, "127.0.0.2", b.ca.HTTPPort, "HTTP/1.1 403 "+secret+"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		}, want: "preflight: answered by something else at 127.0.0.2:PORT: HTTP 403 Forbidden"},
		{name: "an answer that is not HTTP", serve: func(t *testing.T, b *bed, _ string) {
			rawServer(t, "127.0.0.2", b.ca.HTTPPort, "SSH-2.0-OpenSSH_9.6 "+secret+"\r\n")
		}, want: "preflight: no answer at 127.0.0.2:PORT: an answer that is not HTTP"},
		{name: "a redirect with credentials and a query", serve: func(t *testing.T, b *bed, name string) {
			b.serveAt(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, "ftp://user:"+secret+"@"+name+"/x?k="+secret, http.StatusFound)
			}))
		}, want: "preflight: redirected to ftp://NAME/x, which the CA does not follow: only http and https are followed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, pebbletest.Options{}, true)
			name := randomName("q")
			pointAt(t, name, "127.0.0.2")
			tc.serve(t, b, name)
			_, err := newIssuer(t, b.pool, nil, preflightConfig(b)).Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: name})
			var pe *issuing.PreflightError
			require.ErrorAs(t, err, &pe, "%T: %v", err, err)
			require.NotContains(t, err.Error(), secret)
			require.Equal(t, strings.NewReplacer("NAME", name, "PORT", strconv.Itoa(b.ca.HTTPPort)).Replace(tc.want), pe.Error())
		})
	}
}

// rawServer answers every connection to ip:port with answer, whatever it was asked,
// and closes it.
func rawServer(t *testing.T, ip string, port int, answer string) {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
				buf := make([]byte, 4096)
				_, _ = conn.Read(buf)
				_, _ = conn.Write([]byte(answer))
			}()
		}
	}()
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
		{name: "redirect the CA follows, to the responder under the same name", arrange: func(t *testing.T, b *bed, name string) {
			pointAt(t, name, "127.0.0.2")
			responder := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: b.ln.Addr().String()})
			b.serveAt(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.RawQuery == "" {
					http.Redirect(w, r, r.URL.Path+"?moved", http.StatusMovedPermanently)
					return
				}
				responder.ServeHTTP(w, r) // the request's Host, the name, is kept
			}))
		}},
		{name: "redirect to the responder under another name", arrange: func(t *testing.T, b *bed, name string) {
			// The CA sends the other name as Host, and the responder answers a token
			// only for its own name (lego's challenge server does the same). The
			// address the other name resolved to is the operator's resolver's
			// answer for a name the tenant may not own: not shown.
			pointAt(t, name, "127.0.0.2")
			b.serveAt(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, "http://other-"+name+":"+strconv.Itoa(b.ca.HTTPPort)+r.URL.Path, http.StatusMovedPermanently)
			}))
		}, want: "preflight: answered by something else at the redirect's host other-NAME (after redirects, http://other-NAME:PORT/.well-known/acme-challenge/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, pebbletest.Options{}, true)
			name := randomName("f")
			if tc.arrange != nil {
				tc.arrange(t, b, name)
			}
			cert, err := newIssuer(t, b.pool, nil, preflightConfig(b)).Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: name})
			require.Zero(t, countRows(t, b.pool, "certworker_http01_tokens"), "the probe token is deleted")
			if tc.want == "" {
				require.NoError(t, err)
				require.NoError(t, parseChain(t, cert.ChainPEM)[0].VerifyHostname(name))
				require.Equal(t, 1, b.ca.OrderRequests())
				return
			}
			var pe *issuing.PreflightError
			require.ErrorAs(t, err, &pe, "%T: %v", err, err)
			want := strings.NewReplacer("NAME", name, "PORT", strconv.Itoa(b.ca.HTTPPort)).Replace(tc.want)
			require.True(t, strings.HasPrefix(pe.Error(), want), "error %q, want %q", pe, want)
			require.Empty(t, b.ca.Requests(), "nothing is sent to the CA, not even for its directory")
			var ue *issuing.CAUnavailableError
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
	_, err := newIssuer(t, b.pool, nil, cfg).Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: name})
	e, ok := asAcmeError(err)
	require.True(t, ok, "the CA's own verdict: %T: %v", err, err)
	require.Equal(t, "urn:ietf:params:acme:error:connection", e.Type)
	require.Equal(t, 1, b.ca.OrderRequests())
}
