package main

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func serveForTest(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := newServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Close() })
	return ln.Addr().String()
}

// The responder faces the internet: a client that sends its headers slowly is cut off
// (slowloris), and a request with oversized headers is refused. Guards against a
// server whose connections any client can hold open for ever.
func TestNewServer_CutsSlowClientsAndLargeHeaders(t *testing.T) {
	t.Parallel()
	addr := serveForTest(t)

	t.Run("slow headers", func(t *testing.T) {
		t.Parallel()
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer conn.Close()
		_, err = conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n")) // and never the end
		require.NoError(t, err)
		start := time.Now()
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
		_, err = bufio.NewReader(conn).ReadString('\n')
		require.Error(t, err, "the server must close the connection")
		require.Less(t, time.Since(start), 8*time.Second, "closed by the server's header timeout, not the test's deadline")
	})

	t.Run("large headers", func(t *testing.T) {
		t.Parallel()
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
		require.NoError(t, err)
		req.Header.Set("X-Padding", strings.Repeat("a", 16<<10))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)

		resp, err = http.Get("http://" + addr + "/")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	})
}
