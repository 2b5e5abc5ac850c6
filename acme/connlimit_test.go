package acme_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/acme"
)

// limitedServer serves h behind a ConnLimiter of max connections, with the header
// timeout far beyond the test, so that only the limiter closes slow connections.
func limitedServer(t *testing.T, max int, h http.Handler) (*acme.ConnLimiter, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l := acme.NewConnLimiter(ln, max, nil)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Minute}
	l.Wrap(srv)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l, ln.Addr().String()
}

// slowConn opens a connection that sends the start of a request and never ends its
// headers, and waits until the server holds it.
func slowConn(t *testing.T, l *acme.ConnLimiter, addr string, want int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = c.Write([]byte("GET /.well-known/acme-challenge/x HTTP/1.1\r\nHost: h.example\r\n"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return l.Open() == want }, 10*time.Second, 5*time.Millisecond)
	return c
}

// closedByServer reports whether the server has closed c (EOF or reset), waiting for
// it at most a few seconds.
func closedByServer(t *testing.T, c net.Conn) bool {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(3*time.Second)))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// At its cap the limiter takes every new connection and closes, to make room, the one
// that has waited longest without a request being answered; a request sent on a new
// connection is answered although slow connections fill the cap. Guards against a
// cap that lets whoever holds it first keep the CA waiting (a blocking Accept), and
// against a process whose memory grows with every connection held.
func TestConnLimiter_ClosesTheLongestWaitingToMakeRoom(t *testing.T) {
	t.Parallel()
	l, addr := limitedServer(t, 3, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok"))
	}))
	first := slowConn(t, l, addr, 1)
	second := slowConn(t, l, addr, 2)
	third := slowConn(t, l, addr, 3)
	fourth := slowConn(t, l, addr, 3)
	require.True(t, closedByServer(t, first), "the longest waiting is closed")
	require.Equal(t, 3, l.Open())

	resp, err := http.Get("http://" + addr + "/")
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, "ok", string(b), "a prompt request is answered at the cap")
	require.LessOrEqual(t, l.Open(), 3)
	require.True(t, closedByServer(t, second), "the next longest waiting made room for it")
	for _, c := range []net.Conn{third, fourth} {
		require.False(t, closedByServer(t, c), "a younger slow connection was closed")
	}
}

// A connection whose request is being answered is never closed to make room: with
// every connection answering, a new one is closed instead; once the answer is done,
// the connection it was on waits like any other. Guards against cutting the CA off
// in the middle of its answer.
func TestConnLimiter_NeverClosesAConnectionBeingAnswered(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}, 1), make(chan struct{})
	l, addr := limitedServer(t, 1, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		started <- struct{}{}
		<-release
		_, _ = w.Write([]byte("answered"))
	}))
	answering, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = answering.Close() })
	_, err = answering.Write([]byte("GET / HTTP/1.1\r\nHost: h.example\r\n\r\n"))
	require.NoError(t, err)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the request was not answered")
	}

	newcomer, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = newcomer.Close() })
	require.True(t, closedByServer(t, newcomer), "the newcomer is refused")
	close(release)
	resp, err := http.ReadResponse(bufio.NewReader(answering), nil)
	require.NoError(t, err, "the connection being answered was closed")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, "answered", string(b))

	// Now idle, it is the one to go when another arrives.
	later := slowConn(t, l, addr, 1)
	require.True(t, closedByServer(t, answering))
	require.False(t, closedByServer(t, later))
}
