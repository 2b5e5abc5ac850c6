package main

import (
	"context"
	"crypto/rand"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
)

// `run` reads each name's CAA records through --preflight-resolver before ordering
// (issue 19): a name whose records name only another CA fails at once, with ssl_error
// starting "caa:" and naming what the records allow, and nothing reaches the CA; a
// name whose records name this CA's identity is issued. Guards against the check
// being built and never wired into run (the worker alone has it as an option).
func TestRun_CAARecordsDecideBeforeOrdering(t *testing.T) {
	t.Parallel()
	bin := buildCertworker(t)
	pool, dsn := pgtest.NewPool(t)
	http01, admin := workertest.FreeAddr(t), workertest.FreeAddr(t)
	_, port, _ := net.SplitHostPort(http01)
	httpPort, _ := strconv.Atoi(port)
	ca := pebbletest.StartT(t, pebbletest.Options{HTTPPort: httpPort, CAAIdentity: "pebble-caa-run.test"})

	suffix := strings.ToLower(rand.Text()[:10])
	forbidden, allowed := "forbidden-"+suffix+".example", "allowed-"+suffix+".example"
	require.NoError(t, pebbletest.SetCAA(forbidden, pebbletest.CAA{Tag: "issue", Value: "sectigo.com"}))
	require.NoError(t, pebbletest.SetCAA(allowed, pebbletest.CAA{Tag: "issue", Value: "pebble-caa-run.test"}))
	t.Cleanup(func() { pebbletest.ClearDNS(forbidden); pebbletest.ClearDNS(allowed) })

	logs, stop := startBinary(t, bin, "run", "--database-url", dsn,
		"--acme-directory", ca.DirectoryURL, "--acme-ca-bundle", ca.RootsFile, "--acme-profile", pebbletest.DefaultProfile,
		"--http01-listen", http01, "--admin-listen", admin,
		"--preflight", "http", "--preflight-resolver", ca.DNSServer, "--preflight-port", port,
		"--preflight-allow-cidr", "127.0.0.0/8",
		"--poll-interval", "2s", "--retry-base", "1s", "--shutdown-grace", "5s")

	tenant := pgtest.Tenant(t, pool)
	pgtest.Domain(t, pool, tenant, forbidden)
	pgtest.Domain(t, pool, tenant, allowed)
	state := func(name string) (status, sslError string) {
		var e *string
		_ = pool.QueryRow(context.Background(), `SELECT ssl_status, ssl_error FROM proxy_domains WHERE domain = $1`, name).Scan(&status, &e)
		if e != nil {
			sslError = *e
		}
		return status, sslError
	}
	waitFor(t, logs, 60*time.Second, "the allowed name was never issued", func() bool {
		s, _ := state(allowed)
		return s == "active"
	})
	waitFor(t, logs, 30*time.Second, "the forbidden name never failed", func() bool {
		s, _ := state(forbidden)
		return s == "failed"
	})
	_, sslError := state(forbidden)
	require.True(t, strings.HasPrefix(sslError, "caa: "), "ssl_error: %q", sslError)
	require.Contains(t, sslError, "sectigo.com", "ssl_error names what the records allow")
	for _, o := range ca.Orders() {
		for _, n := range o.Identifiers {
			require.NotEqual(t, forbidden, n, "a name its CAA records forbid reached the CA")
		}
	}
	var attempts int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT ssl_attempts FROM proxy_domains WHERE domain = $1`, forbidden).Scan(&attempts))
	require.LessOrEqual(t, attempts, 1)
	stop()
}
