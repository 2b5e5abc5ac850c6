package pebbletest_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
)

// A CA whose directory cannot be fetched with RootsPEM as the only trust would be
// useless to the worker, which trusts exactly that file through --acme-ca-bundle.
func TestStart_DirectoryIsServedOverTLSTrustedByRoots(t *testing.T) {
	t.Parallel()
	ca := pebbletest.StartT(t, pebbletest.Options{})

	file, err := os.ReadFile(ca.RootsFile)
	require.NoError(t, err)
	require.Equal(t, ca.RootsPEM(), file, "RootsFile must hold RootsPEM")

	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(ca.RootsPEM()))
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}},
	}
	resp, err := client.Get(ca.DirectoryURL)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var dir map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&dir))
	require.NotEmpty(t, dir["newOrder"])
	require.NotEmpty(t, dir["renewalInfo"], "ARI must be advertised")
	require.NotZero(t, ca.HTTPPort, "a free HTTP-01 port is picked when none is given")
	require.NotEmpty(t, ca.IssuerRootsPEM())
}

// Two CAs in one process with different options must each keep their own: Pebble
// reads its knobs from the environment, which Start changes and restores.
func TestStart_ParallelCAsWithDifferentOptionsAndCloseTwice(t *testing.T) {
	t.Parallel()
	a := pebbletest.StartT(t, pebbletest.Options{NonceReject: 50, ShortLifetime: 5 * time.Minute})
	b := pebbletest.StartT(t, pebbletest.Options{})
	require.NotEqual(t, a.DirectoryURL, b.DirectoryURL)
	_, set := pebbletest.LookupEnvLocked("PEBBLE_WFE_NONCEREJECT")
	require.False(t, set, "Start must restore the environment")
	require.NoError(t, a.Close())
	require.NoError(t, a.Close(), "Close twice")
	_, err := os.Stat(a.RootsFile)
	require.True(t, os.IsNotExist(err), "Close removes RootsFile")
}

// caClient trusts the CA's TLS certificate (and a Front's, which shares it).
func caClient(t *testing.T, ca *pebbletest.CA) *http.Client {
	t.Helper()
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(ca.RootsPEM()))
	return &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, DisableKeepAlives: true},
	}
}

// newOrderBody is a new-order request for names, shaped as a JWS (the front reads
// the payload; Pebble will refuse the missing signature).
func newOrderBody(t *testing.T, names ...string) string {
	t.Helper()
	var ids []map[string]string
	for _, n := range names {
		ids = append(ids, map[string]string{"type": "dns", "value": n})
	}
	payload, err := json.Marshal(map[string]any{"identifiers": ids, "profile": pebbletest.DefaultProfile})
	require.NoError(t, err)
	body, err := json.Marshal(map[string]string{
		"protected": "e30", "signature": "c2ln", "payload": base64.RawURLEncoding.EncodeToString(payload),
	})
	require.NoError(t, err)
	return string(body)
}

// A Front answers the requests its rules choose (by step, by the order's names, a
// number of times) and passes the rest to the CA, which then counts only what
// reached it; down, it resets every connection. Guards against the lead's queue
// tests rate-limiting, or cutting off, more or less than they asked for.
func TestFront_AnswersChosenRequestsAndPassesTheRest(t *testing.T) {
	t.Parallel()
	ca := pebbletest.StartT(t, pebbletest.Options{})
	front := pebbletest.NewFront(t, ca)
	client := caClient(t, ca)
	front.Add(pebbletest.Rule{Step: pebbletest.StepDirectory, Times: 1, Answer: pebbletest.Unavailable(http.StatusServiceUnavailable)})
	front.Add(pebbletest.Rule{Step: pebbletest.StepNewOrder, Names: []string{"limited.example"},
		Answer: pebbletest.RateLimitedRegisteredDomain("limited.example", time.Hour)})

	resp, err := client.Get(front.DirectoryURL)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "the rule answers the first directory request")
	resp, err = client.Get(front.DirectoryURL)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "a spent rule passes the next one to Pebble")
	require.Equal(t, 1, ca.Requests()[pebbletest.StepDirectory])

	newOrderURL := strings.TrimSuffix(front.DirectoryURL, pebbletest.DirectoryPath) + pebbletest.NewOrderPath
	post := func(names ...string) (int, string, string) {
		resp, err := client.Post(newOrderURL, "application/jose+json", strings.NewReader(newOrderBody(t, names...)))
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, resp.Header.Get("Retry-After"), string(body)
	}
	status, retryAfter, body := post("other.example", "limited.example")
	require.Equal(t, http.StatusTooManyRequests, status)
	require.Equal(t, "3600", retryAfter)
	require.Contains(t, body, `"type":"urn:ietf:params:acme:error:rateLimited"`)
	require.Contains(t, body, `too many certificates (50) already issued for \"limited.example\"`)
	require.Zero(t, ca.OrderRequests(), "an answered order never reaches the CA")
	status, _, _ = post("free.example")
	require.NotEqual(t, http.StatusTooManyRequests, status, "other names pass to Pebble (which refuses the unsigned request)")
	require.Equal(t, 1, ca.OrderRequests())
	require.Equal(t, map[pebbletest.Step]int{pebbletest.StepDirectory: 1, pebbletest.StepNewOrder: 1}, front.Answered())

	front.SetDown(true)
	_, err = client.Get(front.DirectoryURL)
	require.Error(t, err, "a CA that is down answers nothing")
	front.Clear()
	resp, err = client.Get(front.DirectoryURL)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// The DNS the CA validates with can point a name elsewhere, nowhere, or back to
// 127.0.0.1. Guards against preflight tests that believe they test a name the DNS
// does not serve as they set it.
func TestDNS_NameCanPointElsewhereOrNowhere(t *testing.T) {
	t.Parallel()
	ca := pebbletest.StartT(t, pebbletest.Options{})
	lookup := func(name string) []string {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		in, _, err := (&dns.Client{Net: "tcp", Timeout: 5 * time.Second}).Exchange(m, ca.DNSServer)
		require.NoError(t, err)
		var out []string
		for _, rr := range in.Answer {
			if a, ok := rr.(*dns.A); ok {
				out = append(out, a.A.String())
			}
		}
		return out
	}
	name := "dns-" + strconv.FormatInt(time.Now().UnixNano(), 36) + ".example"
	t.Cleanup(func() { pebbletest.ClearDNS(name) })
	require.Equal(t, []string{"127.0.0.1"}, lookup(name))
	require.NoError(t, pebbletest.SetA(name, "127.0.0.2"))
	require.Equal(t, []string{"127.0.0.2"}, lookup(name))
	require.NoError(t, pebbletest.SetNoAddress(name))
	require.Empty(t, lookup(name))
	pebbletest.ClearDNS(name)
	require.Equal(t, []string{"127.0.0.1"}, lookup(name))
}

// Each CA advertises its own CAA identity in its directory's meta.caaIdentities
// (the default one when none is given), which a worker compares with CAA records.
// Guards the two-CA tests against CAs that cannot be told apart by CAA.
func TestStart_EachCAAdvertisesItsOwnCAAIdentity(t *testing.T) {
	t.Parallel()
	one := pebbletest.StartT(t, pebbletest.Options{})
	two := pebbletest.StartT(t, pebbletest.Options{CAAIdentity: "pebble-two.test"})
	for _, tc := range []struct {
		ca   *pebbletest.CA
		want string
	}{{one, pebbletest.DefaultCAAIdentity}, {two, "pebble-two.test"}} {
		resp, err := caClient(t, tc.ca).Get(tc.ca.DirectoryURL)
		require.NoError(t, err)
		var dir struct {
			Meta struct {
				CAAIdentities []string `json:"caaIdentities"`
			} `json:"meta"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&dir))
		_ = resp.Body.Close()
		require.Equal(t, []string{tc.want}, dir.Meta.CAAIdentities)
		require.Equal(t, tc.want, tc.ca.CAAIdentity)
	}
}

// With SetOneAtATime, requests sent at once reach the CA one after another: each
// starts at the CA after the one before it ended there. The requests are for a
// certificate the CA never issued, which the CA holds for 5 s (settleIssued) before
// it answers: long enough that two let through at once would meet.
func TestFront_OneAtATimeLetsOneRequestReachTheCAAtATime(t *testing.T) {
	t.Parallel()
	ca := pebbletest.StartT(t, pebbletest.Options{})
	front := pebbletest.NewFront(t, ca)
	front.SetOneAtATime(true)
	client := caClient(t, ca)
	client.Timeout = time.Minute // the second waits for the first's 5 s, then its own
	certURL := strings.TrimSuffix(front.DirectoryURL, pebbletest.DirectoryPath) + "/certZ/0123456789abcdef"
	const n = 2
	errs := make(chan error, n)
	for range n {
		go func() {
			resp, err := client.Post(certURL, "application/jose+json", strings.NewReader("{}"))
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
			errs <- err
		}()
	}
	for range n {
		require.NoError(t, <-errs)
	}
	var handled []pebbletest.Handled
	for _, h := range ca.Handled() {
		if h.Step == pebbletest.StepCertificate {
			handled = append(handled, h)
		}
	}
	require.Len(t, handled, n)
	slices.SortFunc(handled, func(a, b pebbletest.Handled) int { return a.Start.Compare(b.Start) })
	for i := 1; i < n; i++ {
		require.False(t, handled[i].Start.Before(handled[i-1].End),
			"request %d started at the CA %s before request %d ended there", i, handled[i-1].End.Sub(handled[i].Start), i-1)
	}
}
