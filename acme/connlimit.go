package acme

import (
	"container/list"
	"context"
	"errors"
	"net"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMaxResponderConns caps the responder's open connections. A connection the
// HTTP server holds costs about 11 KiB live (its goroutine's stack, 4 KiB buffers to
// read and to write, the connection's state), and the garbage collector lets the
// heap grow to about twice what is live. Measured (bench/http01-connections.txt),
// 20,000 slow connections held against `certworker run` kept it at a peak of 132 MiB
// resident at this cap, half the 256 MiB a worker is given in deploy/ (GOMEMLIMIT
// 192MiB), and the order in flight was validated through the flood; with no cap the
// same flood had it at 207 MiB with 12,000 connections open, and growing with every
// connection the flood adds. The CA needs a handful: Let's Encrypt validates each
// challenge from about five places, once.
const DefaultMaxResponderConns = 4096

// ConnLimiter is a listener that holds at most max connections open. At the cap, a
// new connection makes room by closing the connection that has waited longest
// without a request being answered on it (a slow client still sending its headers,
// or one idle between requests); one whose request is being answered is never
// closed. When every connection is being answered, the newcomer is closed instead.
//
// Why not block Accept at the cap, as golang.org/x/net/netutil's LimitListener does:
// then whoever holds max connections (for the 5 s the server allows for headers, and
// again, and again) keeps everyone else, the CA included, waiting in the kernel's
// queue and its SYN retries until the CA's validation times out. Here a new
// connection is always taken, and the ones that starve are the oldest idle ones: a
// client that sends its request at once, as the CA does, is answered, while a slow
// one is closed once max newer connections have come after it.
//
// The server must be wired with Wrap, which tells the limiter when a request is
// being answered.
type ConnLimiter struct {
	net.Listener
	max int
	m   connMetrics

	mu sync.Mutex
	// conns holds the open connections, *limitedConn, the longest waiting first: in
	// the order accepted, a connection moving to the back when its request has been
	// answered. Guarded by mu.
	conns list.List
}

// NewConnLimiter caps ln at max open connections (DefaultMaxResponderConns when max
// is 0 or less). reg, if not nil, receives certworker_http01_connections_open and
// certworker_http01_connections_closed_total{reason}.
func NewConnLimiter(ln net.Listener, max int, reg prometheus.Registerer) *ConnLimiter {
	if max <= 0 {
		max = DefaultMaxResponderConns
	}
	return &ConnLimiter{Listener: ln, max: max, m: newConnMetrics(reg, "http01")}
}

// Wrap makes srv report to the limiter which connections have a request being
// answered: it sets srv.ConnContext and wraps srv.Handler.
func (l *ConnLimiter) Wrap(srv *http.Server) {
	next := srv.ConnContext
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if next != nil {
			ctx = next(ctx, c)
		}
		if lc, ok := c.(*limitedConn); ok && lc.l == l {
			ctx = context.WithValue(ctx, limitedConnKey{}, lc)
		}
		return ctx
	}
	h := srv.Handler
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lc, _ := r.Context().Value(limitedConnKey{}).(*limitedConn)
		if lc != nil {
			l.serving(lc, true)
			defer l.serving(lc, false)
		}
		h.ServeHTTP(w, r)
	})
}

type limitedConnKey struct{}

// Accept returns the next connection, having made room for it under the cap.
func (l *ConnLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc := &limitedConn{Conn: c, l: l}
		victim, ok := l.admit(lc)
		if victim != nil {
			// Outside the lock: the victim's Close takes it, to leave the list.
			_ = victim.Close()
			l.m.closed(closedEvicted)
		}
		if ok {
			return lc, nil
		}
		// Every connection is being answered: this one waits for nothing.
		_ = c.Close()
		l.m.closed(closedRefused)
	}
}

// admit adds lc to the open connections, and returns the connection to close to
// make room for it, if any; false when there is no room.
func (l *ConnLimiter) admit(lc *limitedConn) (*limitedConn, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var victim *limitedConn
	if l.conns.Len() >= l.max {
		for e := l.conns.Front(); e != nil; e = e.Next() {
			if c := e.Value.(*limitedConn); !c.answering {
				victim = c
				break
			}
		}
		if victim == nil {
			return nil, false
		}
		l.removeLocked(victim)
	}
	lc.elem = l.conns.PushBack(lc)
	l.m.open.Set(float64(l.conns.Len()))
	return victim, true
}

// serving marks lc as answering a request, or done with one; done, it goes to the
// back of the line, as if it had just arrived.
func (l *ConnLimiter) serving(lc *limitedConn, answering bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lc.answering = answering
	if !answering && lc.elem != nil {
		l.conns.MoveToBack(lc.elem)
	}
}

// removeLocked takes lc out of the open connections; called with mu held.
func (l *ConnLimiter) removeLocked(lc *limitedConn) {
	if lc.elem != nil {
		l.conns.Remove(lc.elem)
		lc.elem = nil
		l.m.open.Set(float64(l.conns.Len()))
	}
}

// Open is the number of connections open.
func (l *ConnLimiter) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns.Len()
}

// limitedConn is a connection the limiter counts until it is closed.
type limitedConn struct {
	net.Conn
	l *ConnLimiter
	// elem is lc's place in l.conns, nil once it left; answering is true while a
	// request on it is being answered. Both guarded by l.mu.
	elem      *list.Element
	answering bool
}

func (c *limitedConn) Close() error {
	c.l.mu.Lock()
	c.l.removeLocked(c)
	c.l.mu.Unlock()
	err := c.Conn.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil // closed twice: by the limiter, then by the server
	}
	return err
}

// Why the limiter closed a connection, the label of
// certworker_http01_connections_closed_total.
const (
	closedEvicted = "evicted" // the longest waiting, to make room for a new one
	closedRefused = "refused" // a new one, every open one being answered
)

type connMetrics struct {
	open   prometheus.Gauge
	closes *prometheus.CounterVec
}

// newConnMetrics are the connection gauge and counter of a server, registered on reg:
// certworker_http01_connections_open and ..._closed_total{reason} of the HTTP-01
// responder, and the same of the DNS-01 server (dns01). Each name is written out
// whole, as every metric of certworker's is, so that the names are found in the code
// by name (the dashboard's test reads them there).
func newConnMetrics(reg prometheus.Registerer, server string) connMetrics {
	const closedHelp = " closed at its connection cap: evicted (the longest waiting without a request being answered, to make room) or refused (a new one, while every open one was being answered)."
	var m connMetrics
	switch server {
	case "dns01":
		m = connMetrics{
			open: prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "certworker_dns01_connections_open",
				Help: "TCP connections the DNS-01 server holds open (at most its cap).",
			}),
			closes: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "certworker_dns01_connections_closed_total",
				Help: "TCP connections the DNS-01 server" + closedHelp,
			}, []string{"reason"}),
		}
	default:
		m = connMetrics{
			open: prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "certworker_http01_connections_open",
				Help: "Connections the HTTP-01 responder holds open (at most its cap).",
			}),
			closes: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "certworker_http01_connections_closed_total",
				Help: "Connections the HTTP-01 responder" + closedHelp,
			}, []string{"reason"}),
		}
	}
	m.closes.WithLabelValues(closedEvicted)
	m.closes.WithLabelValues(closedRefused)
	if reg != nil {
		reg.MustRegister(m.open, m.closes)
	}
	return m
}

func (m connMetrics) closed(reason string) { m.closes.WithLabelValues(reason).Inc() }
