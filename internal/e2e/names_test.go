package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// Names no public CA can issue for are failed with a reason and never reach the CA;
// a name in upper case is issued, in lower case. Guards against spending the CA's
// rate limit (and a day of retries) on names it must refuse, against a row the proxy
// wrote badly being retried forever with nothing said, and against an upper-case
// name ordered as it is stored (the CA lower-cases it, and the leaf would not match
// what the worker asked for).
func TestE2E_InvalidNamesNeverReachTheCA(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	w.startWorker(t, "names", w.acmeConfig(), worker.Config{Concurrency: 4, PollInterval: 30 * time.Second})

	valid := randomName("valid")
	upperLabel := "UPPER-" + strings.ToUpper(randomHex())
	upper := upperLabel + ".Example"
	invalid := []string{
		"*.wild-" + randomHex() + ".example",         // wildcard
		"localhost",                                  // a single label
		"a..b-" + randomHex() + ".example",           // empty label
		"1.2.3.4",                                    // IPv4 address
		"[::1]",                                      // IPv6 address
		"bücher-" + randomHex() + ".example",         // a U-label, not an A-label
		"trailing-" + randomHex() + ".example.",      // trailing dot
		"-lead-" + randomHex() + ".example",          // leading hyphen
		"under_score-" + randomHex() + ".example",    // character outside LDH
		strings.Repeat("x", 64) + ".example",         // label over 63
		strings.Repeat("abcdefghi.", 25) + "example", // 257 characters
		"10.0.0.010",                                 // numeric last label
	}
	ids := w.addDomains(t, append([]string{valid, upper}, invalid...)...)
	validID, upperID, invalidIDs := ids[0], ids[1], ids[2:]

	waitFor(t, time.Minute, "every domain to be settled", func() bool {
		st := w.statuses(t)
		return st["active"]+st["failed"] == len(ids)
	})
	require.Equal(t, "active", w.domain(t, validID).Status)
	require.Equal(t, "active", w.domain(t, upperID).Status, "a name in upper case must be issued")
	for i, id := range invalidIDs {
		d := w.domain(t, id)
		require.Equal(t, "failed", d.Status, "%q", invalid[i])
		require.NotNil(t, d.Error, "%q failed without a reason", invalid[i])
		require.True(t, strings.HasPrefix(*d.Error, issuing.InvalidDomainPrefix), "%q: ssl_error %q", invalid[i], *d.Error)
		t.Logf("%-40q %s", invalid[i], *d.Error)
	}

	require.Equal(t, 2, w.ca.OrderRequests(), "only the two issuable names may reach the CA")
	var got []string
	for _, o := range w.ca.Orders() {
		got = append(got, o.Identifiers...)
	}
	require.ElementsMatch(t, []string{valid, strings.ToLower(upper)}, got, "what the CA was asked for")

	// The certificate is stored under the domain as the proxy wrote it, and names it
	// in lower case.
	var chain string
	require.NoError(t, w.pool.QueryRow(w.ctx, `SELECT certificate_pem FROM proxy_certificates WHERE domain = $1`, upper).Scan(&chain))
	leaf, err := issuing.LeafFromPEM(chain)
	require.NoError(t, err)
	require.Equal(t, []string{strings.ToLower(upper)}, leaf.DNSNames)
}
