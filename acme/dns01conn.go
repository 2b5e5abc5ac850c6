package acme

import (
	"errors"
	"net"
	"sync"
	"time"
)

// The DNS-01 server's TCP connections. A resolver connects, asks and goes; anyone
// else may hold connections open to use up the server's descriptors and memory. So:
// at most dns01MaxTCPConns at once, a newcomer at the cap closing the oldest
// (ConnLimiter: a flood of idle connections never keeps a real resolver out); each
// connection closed after dns01TCPIdle without a question and dns01TCPTotal in all,
// however it trickles its questions; and an Accept that fails (descriptors used up)
// is retried after a pause, not in a loop that takes a core.
const (
	// dns01MaxTCPConns caps the open connections: a connection costs a
	// goroutine and its buffers, a few KiB. NSD's default is 100 and Knot's a
	// few hundred; answers over TCP are the fallback of truncated UDP ones and
	// last milliseconds.
	dns01MaxTCPConns = 512

	// dns01TCPIdle is how long a connection may wait for its next question (RFC
	// 7766 §6.2.3 asks for seconds, not minutes, for a server under load).
	dns01TCPIdle = 5 * time.Second

	// dns01TCPTotal is how long a connection may stay open, whatever it sends: a
	// resolver's questions take milliseconds.
	dns01TCPTotal = 10 * time.Second

	// The pause after a failed Accept grows from acceptPauseMin to acceptPauseMax
	// (net/http's figures), and starts again after an Accept that succeeds.
	acceptPauseMin = 5 * time.Millisecond
	acceptPauseMax = time.Second
)

// tcpLimits is the listener under the DNS-01 server's ConnLimiter: it pauses after a
// failed Accept, and gives each connection a deadline of total after it was accepted
// that no later deadline moves.
type tcpLimits struct {
	net.Listener
	total time.Duration

	closeOnce sync.Once
	closed    chan struct{}
	pause     time.Duration // only Accept's goroutine touches it
}

func newTCPLimits(ln net.Listener, total time.Duration) *tcpLimits {
	return &tcpLimits{Listener: ln, total: total, closed: make(chan struct{})}
}

// Accept returns the next connection; when the listener fails it returns the error
// only after a pause, so that the server's loop (which retries at once on a
// temporary error such as running out of descriptors) does not spin.
func (l *tcpLimits) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.pause = 0
		end := time.Now().Add(l.total)
		if err := c.SetDeadline(end); err != nil {
			_ = c.Close()
			return nil, err
		}
		return &totalTimeConn{Conn: c, end: end}, nil
	}
	if errors.Is(err, net.ErrClosed) {
		return nil, err
	}
	l.pause = min(max(2*l.pause, acceptPauseMin), acceptPauseMax)
	t := time.NewTimer(l.pause)
	defer t.Stop()
	select {
	case <-t.C:
	case <-l.closed:
	}
	return nil, err
}

// Close closes the listener and ends a pause under way.
func (l *tcpLimits) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// totalTimeConn is a connection whose deadlines are never later than end.
type totalTimeConn struct {
	net.Conn
	end time.Time
}

func (c *totalTimeConn) bound(t time.Time) time.Time {
	if t.IsZero() || t.After(c.end) {
		return c.end
	}
	return t
}

func (c *totalTimeConn) SetDeadline(t time.Time) error { return c.Conn.SetDeadline(c.bound(t)) }
func (c *totalTimeConn) SetReadDeadline(t time.Time) error {
	return c.Conn.SetReadDeadline(c.bound(t))
}
func (c *totalTimeConn) SetWriteDeadline(t time.Time) error {
	return c.Conn.SetWriteDeadline(c.bound(t))
}
