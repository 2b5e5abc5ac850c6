package main

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/pgtest"
)

// An --http01-listen address already taken stops run before it does anything else:
// no account at the CA, no claim, no order, and exit 2 naming the flag. Guards
// against binding the responder after the worker has started, as run once did: the
// worker ordered at once, and the CA's validations then found nothing listening
// (connection refused, a failed authorization charged against the name).
func TestRun_AnAddressAlreadyTakenStopsRunBeforeItOrders(t *testing.T) {
	t.Parallel()
	bin := buildCertworker(t)
	pool, dsn := pgtest.NewPool(t)
	ca := pebbletest.StartT(t, pebbletest.Options{})
	id := pgtest.Domain(t, pool, pgtest.Tenant(t, pool), "taken-port.example")
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "run",
		"--database-url", dsn,
		"--acme-directory", ca.DirectoryURL,
		"--acme-ca-bundle", ca.RootsFile,
		"--preflight", "off",
		"--http01-listen", taken.Addr().String(),
		"--admin-listen", "").CombinedOutput()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "run did not fail: %v\n%s", err, out)
	require.Equal(t, exitUsage, exit.ExitCode(), "%s", out)
	require.Contains(t, string(out), "--http01-listen: cannot listen on "+taken.Addr().String()+": bind: address already in use")
	require.NotContains(t, string(out), "worker started")
	require.Zero(t, ca.NewAccounts(), "run registered an account before finding its address taken")
	require.Zero(t, ca.OrderRequests(), "run ordered before finding its address taken")

	var status, claimedBy string
	var attempts int
	require.NoError(t, pool.QueryRow(ctx, `SELECT ssl_status, coalesce(ssl_claimed_by, ''), ssl_attempts FROM proxy_domains WHERE id = $1`, id).
		Scan(&status, &claimedBy, &attempts))
	require.Equal(t, "pending", status)
	require.Empty(t, claimedBy)
	require.Zero(t, attempts)
}
