package acme_test

import (
	"context"
	"errors"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/certworker/certworker/acme"
)

// dns01TCPCap is the server's cap on open TCP connections (dns01MaxTCPConns).
const dns01TCPCap = 512

// 3,000 idle TCP connections leave the server holding at most its cap, the oldest
// closed to make room, and a fresh question over TCP is answered within 1 s. Guards
// against a server with no cap, which a flood of idle connections holds until its
// descriptors and memory are gone, and against a cap that keeps newcomers out.
func TestDNS01Server_IdleTCPConnectionsHoldAtMostTheCap(t *testing.T) {
	t.Parallel()
	pool, _ := newTestPool(t)
	s, addr := startDNS01(t, pool, acme.DNS01Options{})
	const idle = 3000
	conns := make([]net.Conn, 0, idle)
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	d := net.Dialer{Timeout: 5 * time.Second}
	for range idle {
		c, err := d.Dial("tcp", addr)
		require.NoError(t, err)
		conns = append(conns, c)
		require.LessOrEqual(t, s.OpenTCP(), dns01TCPCap)
	}

	start := time.Now()
	in, _, err := (&dns.Client{Net: "tcp", Timeout: time.Second}).Exchange(soaQuestion(), addr)
	took := time.Since(start)
	require.NoError(t, err)
	require.Equal(t, dns.RcodeSuccess, in.Rcode)
	require.Less(t, took, time.Second)
	require.LessOrEqual(t, s.OpenTCP(), dns01TCPCap)

	// From the clients' side: the connections the server closed read EOF at once,
	// the ones it holds time out.
	var open atomic.Int64
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			var b [1]byte
			if _, err := c.Read(b[:]); errors.Is(err, os.ErrDeadlineExceeded) {
				open.Add(1)
			}
		}()
	}
	wg.Wait()
	t.Logf("fresh question answered in %s; %d of %d idle connections still open", took, open.Load(), idle)
	require.LessOrEqual(t, open.Load(), int64(dns01TCPCap))
}

// A client that keeps its TCP connection busy with a question every 4.5 s (never idle
// for the 5 s the server allows between questions) is closed within 15 s all the
// same. Guards against a read deadline per message, which let such a client hold a
// connection for as long as it kept trickling.
func TestDNS01Server_TricklingTCPClientIsClosed(t *testing.T) {
	t.Parallel()
	pool, _ := newTestPool(t)
	_, addr := startDNS01(t, pool, acme.DNS01Options{})
	c, err := dns.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	connected := time.Now()
	var answered atomic.Int64
	closed := make(chan time.Time, 1)
	go func() {
		for {
			if _, err := c.ReadMsg(); err != nil {
				closed <- time.Now()
				return
			}
			answered.Add(1)
		}
	}()
	tick := time.NewTicker(4500 * time.Millisecond)
	defer tick.Stop()
	bound := time.NewTimer(15 * time.Second)
	defer bound.Stop()
	require.NoError(t, c.WriteMsg(soaQuestion()))
	for {
		select {
		case at := <-closed:
			t.Logf("closed after %s, %d questions answered", at.Sub(connected), answered.Load())
			require.GreaterOrEqual(t, answered.Load(), int64(2), "its questions were answered until then")
			return
		case <-tick.C:
			_ = c.WriteMsg(soaQuestion())
		case <-bound.C:
			t.Fatalf("still open after 15 s, %d questions answered", answered.Load())
		}
	}
}

// failingListener fails every Accept as a process out of descriptors does (EMFILE, a
// temporary error), and reports each call.
type failingListener struct {
	calls  chan time.Time
	closed chan struct{}
	once   sync.Once
}

func (l *failingListener) Accept() (net.Conn, error) {
	select {
	case <-l.closed:
		return nil, net.ErrClosed
	default:
	}
	select {
	case l.calls <- time.Now():
	default:
	}
	return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
}

func (l *failingListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *failingListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// A failed Accept is retried after a pause that grows (from 5 ms), not at once: six
// calls take at least 5+10+20+40+80 ms. Guards against a loop that, with the
// descriptors used up, took 90% of a core retrying.
func TestDNS01Server_PausesAfterAFailedAccept(t *testing.T) {
	t.Parallel()
	s, err := acme.NewDNS01Server(nil, zap.NewNop(), acme.DNS01Options{Zone: testZone, Nameservers: []string{"ns1.certworker.test"}})
	require.NoError(t, err)
	ln := &failingListener{calls: make(chan time.Time, 16), closed: make(chan struct{})}
	require.NoError(t, s.Serve(nil, ln))
	t.Cleanup(s.Shutdown)
	var at []time.Time
	for len(at) < 6 {
		select {
		case c := <-ln.calls:
			at = append(at, c)
		case <-time.After(10 * time.Second):
			t.Fatalf("Accept called %d times in 10 s", len(at))
		}
	}
	took := at[5].Sub(at[0])
	t.Logf("six Accepts in %s", took)
	require.GreaterOrEqual(t, took, 155*time.Millisecond)
}

// With the values table locked (a read waits), 4,000 questions a second for a second
// keep the server's goroutines within its bound of questions waiting for a read: the
// ones beyond it are answered SERVFAIL at once (or dropped, when the machine cannot
// keep up), and the ones that waited are answered once the table is free. Guards against a goroutine per packet, which made 3,808 waiting
// goroutines in the same flood (RSS 20 -> 42 MB) and would grow with the rate.
func TestDNS01Server_LockedTableKeepsGoroutinesBounded(t *testing.T) {
	// Not parallel: it counts the process's goroutines.
	pool, _ := newTestPool(t)
	_, addr := startDNS01(t, pool, acme.DNS01Options{})
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // released below
	_, err = tx.Exec(ctx, `LOCK TABLE certworker_dns01_values IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	defer pc.Close()
	require.NoError(t, pc.(*net.UDPConn).SetReadBuffer(4<<20))
	to, err := net.ResolveUDPAddr("udp", addr)
	require.NoError(t, err)
	var servfail, nxdomain atomic.Int64
	read := readAnswers(pc, func(in *dns.Msg) {
		switch in.Rcode {
		case dns.RcodeServerFailure:
			servfail.Add(1)
		case dns.RcodeNameError:
			nxdomain.Add(1)
		}
	})

	const bound = acme.DefaultDNS01MaxInflight
	base := runtime.NumGoroutine()
	peak := base
	const rate, total = 4000, 4000
	start := time.Now()
	sent := 0
	for sent < total {
		due := int(time.Since(start) * rate / time.Second)
		for ; sent < min(due, total); sent++ {
			m := new(dns.Msg)
			m.SetQuestion(randomHex(16)+"."+testZone+".", dns.TypeTXT)
			b, err := m.Pack()
			require.NoError(t, err)
			_, err = pc.WriteTo(b, to)
			require.NoError(t, err)
		}
		peak = max(peak, runtime.NumGoroutine())
		time.Sleep(time.Millisecond)
	}
	flood := time.Since(start)
	peak = max(peak, runtime.NumGoroutine())
	servfailLocked := servfail.Load()
	require.NoError(t, tx.Rollback(ctx))
	deadline := time.Now().Add(10 * time.Second)
	for nxdomain.Load() < bound && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // for a late answer that should not come
	_ = pc.Close()
	<-read
	t.Logf("%d questions in %s: goroutines %d at the start, %d at the peak; %d SERVFAIL while locked, %d in all; %d NXDOMAIN after; %d unanswered (dropped by the server or the kernel)",
		sent, flood, base, peak, servfailLocked, servfail.Load(), nxdomain.Load(), int64(sent)-servfail.Load()-nxdomain.Load())
	require.LessOrEqual(t, peak-base, bound+32, "goroutines beyond the bound")
	require.Equal(t, int64(bound), nxdomain.Load(), "the questions that waited, one per slot, are answered once the table is free")
	require.Positive(t, servfailLocked, "the others are answered SERVFAIL at once, or dropped")
}

// soaQuestion asks the apex's SOA, which needs no read.
func soaQuestion() *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(testZone), dns.TypeSOA)
	return m
}
