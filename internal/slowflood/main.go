// Command slowflood holds many slow connections open against an HTTP server, as a
// slowloris attack does, for the responder's connection-flood benchmark
// (internal/e2e, BenchmarkResponderConnectionFlood). It is a process of its own so
// that its memory and CPU are not the server's, and so that its file descriptors
// are not counted against the benchmark's.
//
// Each of -conns connections sends the start of a challenge request, then one more
// header line every -every, never ending its headers; when the server closes it,
// it connects again at once, so the flood keeps -conns connections open or being
// opened for as long as it runs. On SIGTERM or SIGINT it prints, as one JSON line
// on stdout, how many connections it opened and how many the server closed, and
// exits 0.
//
// Usage: slowflood -addr HOST:PORT [-conns N] [-local IP] [-every DURATION]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// stats is what the flood prints at the end.
type stats struct {
	// Connects is every connection opened.
	Connects int64 `json:"connects"`
	// DialErrors are connections that could not be opened (each waits 10 ms).
	DialErrors int64 `json:"dial_errors"`
	// ClosedByServer are the connections the server closed (EOF or a reset).
	ClosedByServer int64 `json:"closed_by_server"`
	// OpenAtEnd are the connections open when the flood was stopped.
	OpenAtEnd int64 `json:"open_at_end"`
	// MaxOpen is the most connections open at once.
	MaxOpen int64 `json:"max_open"`
	// Seconds is how long the flood ran.
	Seconds float64 `json:"seconds"`
}

func main() {
	addr := flag.String("addr", "", "server address, HOST:PORT")
	conns := flag.Int("conns", 5000, "connections to hold")
	local := flag.String("local", "", "local IP to connect from (a loopback address of its own spreads the ports)")
	every := flag.Duration("every", time.Second, "time between two header lines on a connection")
	flag.Parse()
	if *addr == "" {
		fmt.Fprintln(os.Stderr, "slowflood: -addr is required")
		os.Exit(2)
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	if *local != "" {
		ip := net.ParseIP(*local)
		if ip == nil {
			fmt.Fprintf(os.Stderr, "slowflood: -local %q is not an IP\n", *local)
			os.Exit(2)
		}
		dialer.LocalAddr = &net.TCPAddr{IP: ip}
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	f := &flood{addr: *addr, dialer: dialer, every: *every}
	start := time.Now()
	var wg sync.WaitGroup
	for range *conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.hold(ctx)
		}()
	}
	<-ctx.Done()
	s := stats{
		Connects: f.connects.Load(), DialErrors: f.dialErrors.Load(), ClosedByServer: f.closed.Load(),
		OpenAtEnd: f.open.Load(), MaxOpen: f.maxOpen.Load(), Seconds: time.Since(start).Seconds(),
	}
	wg.Wait()
	if err := json.NewEncoder(os.Stdout).Encode(s); err != nil {
		os.Exit(1)
	}
}

type flood struct {
	addr   string
	dialer *net.Dialer
	every  time.Duration

	connects, dialErrors, closed, open, maxOpen atomic.Int64
}

// hold keeps one connection open, or being opened, until ctx ends.
func (f *flood) hold(ctx context.Context) {
	for ctx.Err() == nil {
		c, err := f.dialer.DialContext(ctx, "tcp", f.addr)
		if err != nil {
			if ctx.Err() == nil {
				f.dialErrors.Add(1)
				sleep(ctx, 10*time.Millisecond)
			}
			continue
		}
		f.connects.Add(1)
		if n := f.open.Add(1); n > f.maxOpen.Load() {
			f.maxOpen.Store(n) // a racy maximum is close enough for a report
		}
		if f.trickle(ctx, c) {
			f.closed.Add(1)
		}
		f.open.Add(-1)
		_ = c.Close()
	}
}

// trickle sends the request's start, then a header line every f.every, until the
// server closes c (true) or ctx ends (false).
func (f *flood) trickle(ctx context.Context, c net.Conn) bool {
	stopper := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stopper()
	if _, err := c.Write([]byte("GET /.well-known/acme-challenge/slowflood HTTP/1.1\r\nHost: flood.example\r\n")); err != nil {
		return ctx.Err() == nil
	}
	buf := make([]byte, 512)
	for i := 0; ; i++ {
		_ = c.SetReadDeadline(time.Now().Add(f.every))
		if _, err := c.Read(buf); err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() || ctx.Err() != nil {
				return ctx.Err() == nil
			}
		}
		if _, err := fmt.Fprintf(c, "X-Slow-%d: 1\r\n", i); err != nil {
			return ctx.Err() == nil
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
