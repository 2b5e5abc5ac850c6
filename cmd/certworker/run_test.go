package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/certworker/certworker/acme"
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

// run's responder caps its connections (--http01-max-connections, here 8): 40 slow
// clients that never end their headers leave at most 8 open, the rest closed to make
// room, and the CA's prompt request for a pending token is still answered, under its
// name. Guards against a responder whose every held connection costs the process
// memory until the pod is killed with its orders in flight.
func TestRun_TheResponderHoldsNoMoreConnectionsThanItsCap(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	token := strings.Repeat("t", 43)
	_, err := pool.Exec(context.Background(), `
INSERT INTO certworker_http01_tokens (token, key_authorization, domain, expires_at)
VALUES ($1, $1 || '.key', 'capped.example', now() + interval '1 hour')`, token)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	srv := serveResponder(zap.NewNop(), ln, acme.HTTP01Handler(pool, zap.NewNop()), 8, reg)
	t.Cleanup(func() { _ = srv.Close() })
	addr := ln.Addr().String()
	metric := func(name, label string) float64 {
		families, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range families {
			for _, m := range mf.GetMetric() {
				if mf.GetName() == name && (label == "" || m.GetLabel()[0].GetValue() == label) {
					return m.GetGauge().GetValue() + m.GetCounter().GetValue()
				}
			}
		}
		return -1
	}

	var closed atomic.Int32
	for range 40 {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		_, err = c.Write([]byte("GET /.well-known/acme-challenge/x HTTP/1.1\r\nHost: capped.example\r\n"))
		require.NoError(t, err)
		go func() {
			if _, err := c.Read(make([]byte, 1)); err != nil {
				closed.Add(1)
			}
		}()
	}
	require.Eventually(t, func() bool { return metric("certworker_http01_connections_closed_total", "evicted") >= 32 },
		30*time.Second, 10*time.Millisecond, "the cap closed fewer than 32 of 40 slow connections")
	require.LessOrEqual(t, metric("certworker_http01_connections_open", ""), 8.0)
	require.Eventually(t, func() bool { return closed.Load() >= 32 }, 30*time.Second, 10*time.Millisecond)

	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/.well-known/acme-challenge/"+token, nil)
	require.NoError(t, err)
	req.Host = "capped.example"
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, token+".key", string(b))
	require.LessOrEqual(t, metric("certworker_http01_connections_open", ""), 8.0)
}
