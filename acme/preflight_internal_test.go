package acme

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/certworker/certworker/queue"
)

// A resolver that does not answer is the worker's trouble, not the name's: the
// preflight lets the order go (the CA decides) instead of charging every domain a
// failed preflight while the worker's DNS is down. Guards against a resolver outage
// failing the whole fleet's domains one attempt at a time.
func TestPreflight_SilentResolverLetsTheOrderGo(t *testing.T) {
	t.Parallel()
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = silent.Close() })
	p := newPreflight(nil, zap.NewNop(), Config{Preflight: PreflightHTTP, PreflightResolver: silent.LocalAddr().String()})
	p.dnsTimeout = 300 * time.Millisecond
	start := time.Now()
	require.NoError(t, p.check(context.Background(), "silent.example"))
	require.Less(t, time.Since(start), 5*time.Second)

	// A cancelled order is not a silent resolver.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = p.check(ctx, "silent.example")
	require.Error(t, err)
	var pe *queue.PreflightError
	require.False(t, errors.As(err, &pe), "%T: %v", err, err)
}

// The preflight follows redirects by the CA's rules (Boulder's VA): 301, 302, 307
// and 308 only, http or https, the HTTP-01 port or 443, a host that is not a lost
// path, no loop, at most 10. Guards against a preflight that passes a name the CA
// will fail, or fails one the CA will pass.
func TestPreflight_RedirectRules(t *testing.T) {
	t.Parallel()
	r := &probeRun{p: &preflight{port: 80}}
	start := mustURL(t, "http://shop.example/.well-known/acme-challenge/t")
	for _, tc := range []struct {
		name   string
		target string
		status int
		via    int
		want   string
	}{
		{"302 to https", "https://www.shop.example/.well-known/acme-challenge/t", http.StatusFound, 1, ""},
		{"308 to the HTTP port", "http://www.shop.example:80/x", http.StatusPermanentRedirect, 1, ""},
		{"303", "http://www.shop.example/x", http.StatusSeeOther, 1, "status 303"},
		{"ftp", "ftp://www.shop.example/x", http.StatusFound, 1, "only http and https"},
		{"another port", "http://www.shop.example:8080/x", http.StatusFound, 1, "only ports 80 and 443"},
		{"lost slash", "http://shop.example.well-known/acme-challenge/t", http.StatusFound, 1, "the host looks like a path that lost its leading '/'"},
		{"loop", start.String(), http.StatusFound, 1, "a redirect loop"},
		{"eleventh", "http://www.shop.example/x", http.StatusFound, 11, "more than 10 redirects"},
		{"long path", "http://www.shop.example/" + strings.Repeat("a", 2001), http.StatusFound, 1, "a path longer than 2000 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req := &http.Request{URL: mustURL(t, tc.target), Response: &http.Response{StatusCode: tc.status}}
			via := make([]*http.Request, tc.via)
			for i := range via {
				via[i] = &http.Request{URL: start}
			}
			err := r.checkRedirect(req, via)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			var pe *queue.PreflightError
			require.ErrorAs(t, err, &pe)
			require.Contains(t, err.Error(), "which the CA does not follow: "+tc.want)
		})
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	require.NoError(t, err)
	return u
}
