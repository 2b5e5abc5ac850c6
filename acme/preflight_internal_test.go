package acme

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
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
	var pe *issuing.PreflightError
	require.False(t, errors.As(err, &pe), "%T: %v", err, err)
}

// The preflight follows redirects by the CA's rules (Boulder's VA): 301, 302, 307
// and 308 only, http or https, the HTTP-01 port or 443, a host that is not a lost
// path, no loop, at most 10, and a host that passes a domain's name rules (no IP
// literal, no single label, which the resolver's search list would complete). Guards against a preflight that passes a name the CA
// will fail, or fails one the CA will pass.
func TestPreflight_RedirectRules(t *testing.T) {
	t.Parallel()
	r := &probeRun{p: &preflight{port: 80, log: zap.NewNop()}, domain: "shop.example"}
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
		{"single label", "http://internaldb/x", http.StatusFound, 1, "not a public host name: a single label"},
		{"IPv4 literal", "http://10.0.0.1/x", http.StatusFound, 1, "not a public host name: an IP address"},
		{"IPv6 literal", "http://[fd00::1]/x", http.StatusFound, 1, "not a public host name: an IP address"},
		{"numeric last label", "http://10.0.0.010/x", http.StatusFound, 1, "not a public host name: the last label is numeric"},
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
			var pe *issuing.PreflightError
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

// Which addresses the preflight refuses: every reserved block of IANA's special-
// purpose registries (loopback, private, link-local and cloud metadata, CGNAT,
// multicast, documentation, benchmarking, class E, NAT64, ULA, 6to4...), IPv4-mapped
// forms judged as the IPv4 address they are, and nothing that is globally routable;
// an allowed range lets its addresses through and no others. Guards against a block
// left out, and against refusing a tenant's real public address.
func TestIsReserved(t *testing.T) {
	t.Parallel()
	reserved := []string{
		"0.0.0.0", "0.1.2.3", "10.0.0.1", "100.64.0.1", "100.127.255.254", "127.0.0.1", "127.255.255.255",
		"169.254.169.254", "172.16.0.1", "172.31.255.255", "192.0.0.8", "192.0.2.1", "192.88.99.1",
		"192.168.1.1", "198.18.0.1", "198.19.255.255", "198.51.100.7", "203.0.113.9", "224.0.0.1",
		"239.255.255.250", "240.0.0.1", "255.255.255.255",
		"::", "::1", "::ffff:127.0.0.1", "::ffff:10.1.2.3", "::ffff:169.254.169.254", "::127.0.0.1",
		"64:ff9b::808:808", "64:ff9b::a00:1", "64:ff9b:1::1", "100::1", "2001::1", "2001:db8::1",
		"2002:a00:1::1", "3fff::1", "5f00::1", "fc00::1", "fd12:3456::1", "fe80::1", "fe80::1%eth0",
		"fec0::1", "ff02::1", "ff0e::1",
	}
	public := []string{
		"1.1.1.1", "8.8.8.8", "100.63.255.255", "100.128.0.0", "172.15.255.255", "172.32.0.0",
		"192.0.1.1", "192.169.0.1", "198.17.255.255", "198.20.0.0", "223.255.255.255",
		"::ffff:8.8.8.8", "2001:4860:4860::8888", "2606:4700:4700::1111", "2a00:1450::1",
	}
	for _, s := range reserved {
		require.True(t, isReserved(netip.MustParseAddr(s), nil), s)
	}
	for _, s := range public {
		require.False(t, isReserved(netip.MustParseAddr(s), nil), s)
	}

	allow, err := ParseAllowCIDR(" 127.0.0.0/8, fd00::/8,::ffff:10.0.0.0/104 ")
	require.NoError(t, err)
	for _, s := range []string{"127.0.0.2", "::ffff:127.0.0.2", "fd00::1", "10.9.9.9"} {
		require.False(t, isReserved(netip.MustParseAddr(s), allow), s)
	}
	for _, s := range []string{"::1", "192.168.0.1", "fc00::1", "169.254.169.254"} {
		require.True(t, isReserved(netip.MustParseAddr(s), allow), s)
	}
}

// --preflight-allow-cidr takes comma-separated ranges, empty parts ignored, and names
// itself and the part it cannot read.
func TestParseAllowCIDR(t *testing.T) {
	t.Parallel()
	got, err := ParseAllowCIDR("")
	require.NoError(t, err)
	require.Empty(t, got)
	got, err = ParseAllowCIDR("10.1.2.3/8,,fd00::1/8")
	require.NoError(t, err)
	require.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}, got)
	for _, bad := range []string{"10.0.0.1", "10.0.0.0/33", "localhost/8", "fe80::%eth0/64"} {
		_, err := ParseAllowCIDR("127.0.0.0/8," + bad)
		require.Error(t, err, bad)
		require.True(t, strings.HasPrefix(err.Error(), "--preflight-allow-cidr: "), err.Error())
		require.Contains(t, err.Error(), bad)
	}
}

// The probe's dialer checks the address it is about to connect to, whatever handed
// it that address: a name whose answer was public when it was checked and is
// loopback when dialed (here, the run's cache says so, as a DNS answer that changed
// would), and an IPv4-mapped IPv6 form of loopback, are refused before any packet
// leaves, with the name and the unmapped address. Guards against a check of the
// names that the connection itself does not honour.
func TestPreflight_DialerRefusesAReservedAddressItIsHanded(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	var accepted atomic.Int32
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_ = conn.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	for _, addr := range []string{"127.0.0.1", "::ffff:127.0.0.1"} {
		r := &probeRun{p: &preflight{port: port, log: zap.NewNop()}, domain: "changed.example", addrs: map[string][]netip.Addr{
			"changed.example": {netip.MustParseAddr(addr)},
		}}
		_, err := r.dial(context.Background(), "tcp", net.JoinHostPort("changed.example", strconv.Itoa(port)))
		var pe *issuing.PreflightError
		require.ErrorAs(t, err, &pe, "%s: %v", addr, err)
		require.Equal(t, "preflight: changed.example resolves to a reserved address (127.0.0.1)", pe.Error())
	}
	require.Zero(t, accepted.Load(), "the dialer connected")

	// Allowed, the same address is dialed.
	r := &probeRun{p: &preflight{port: port, log: zap.NewNop(), allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}},
		domain: "changed.example", addrs: map[string][]netip.Addr{"changed.example": {netip.MustParseAddr("127.0.0.1")}}}
	conn, err := r.dial(context.Background(), "tcp", net.JoinHostPort("changed.example", strconv.Itoa(port)))
	require.NoError(t, err)
	_ = conn.Close()
}
