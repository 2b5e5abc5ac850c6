package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// healthcheck exits 0 only while /readyz answers 200, and 1 otherwise: not ready, no
// instance listening, or nothing to probe (never 2, which Docker reserves). An
// address that listens on every interface is probed on loopback.
func TestHealthcheck_ExitsZeroOnlyWhenReady(t *testing.T) {
	var ready atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		if !ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("listener not connected\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	}))
	t.Cleanup(srv.Close)
	addr := srv.Listener.Addr().String()
	_, port, _ := net.SplitHostPort(addr)

	code, stdout, stderr := invoke(t, "healthcheck", "--admin-listen", addr)
	require.Equal(t, exitFailed, code)
	require.Contains(t, stderr, "503")
	require.Contains(t, stderr, "listener not connected")
	require.Empty(t, stdout)

	ready.Store(true)
	for _, listen := range []string{addr, ":" + port, "0.0.0.0:" + port} {
		code, stdout, stderr = invoke(t, "healthcheck", "--admin-listen", listen)
		require.Equal(t, exitOK, code, "%s: %s", listen, stderr)
		require.Equal(t, "ready\n", stdout)
	}
	t.Setenv("CERTWORKER_ADMIN_LISTEN", addr) // the variable run reads, too
	code, _, stderr = invoke(t, "healthcheck")
	require.Equal(t, exitOK, code, stderr)

	srv.Close()
	code, _, stderr = invoke(t, "healthcheck", "--admin-listen", addr)
	require.Equal(t, exitFailed, code)
	require.Contains(t, stderr, "not ready")

	code, _, stderr = invoke(t, "healthcheck", "--admin-listen", "")
	require.Equal(t, exitFailed, code)
	require.Contains(t, stderr, "--admin-listen")
	code, _, stderr = invoke(t, "healthcheck", "--admin-listen", "nonsense")
	require.Equal(t, exitFailed, code)
	require.Contains(t, stderr, "--admin-listen")
}
