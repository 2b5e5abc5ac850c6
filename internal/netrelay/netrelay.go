// Package netrelay is a TCP relay on loopback for tests that take the network away from
// one party while the others keep theirs: one worker instance cut off from PostgreSQL
// while the rest of the fleet still reaches it, or a connection that stops passing bytes
// without being closed (a half-dead session the server keeps for as long as its
// keepalives allow).
//
//	r := netrelay.Start(t, "127.0.0.1:5432") // forwards 127.0.0.1:PORT to the target
//	dsn := "postgres://...@" + r.Addr() + "/db"
//	r.Blackhole() // connections stay open, bytes stop in both directions
//	r.Cut()       // every connection is reset, new ones are refused
//	r.Restore()   // new connections are forwarded again
//
// Blackhole holds what it reads instead of dropping it, so Restore after Blackhole
// delivers it late, as a network that comes back would; bytes held when Cut runs are
// lost with their connection.
package netrelay

import (
	"fmt"
	"net"
	"sync"
	"testing"
)

// mode is what the relay does with traffic.
type mode int

const (
	forward   mode = iota // pass bytes both ways
	blackhole             // keep connections, pass nothing
	cut                   // reset connections, refuse new ones
)

// Relay forwards TCP connections from Addr to a target, until it is told otherwise.
type Relay struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cond  *sync.Cond // signalled when mode changes
	mode  mode
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// Start listens on 127.0.0.1:0 and forwards to target until the test ends.
func Start(t testing.TB, target string) *Relay {
	t.Helper()
	return StartOn(t, "127.0.0.1:0", target)
}

// StartOn is Start listening on addr (HOST:PORT, port 0 for any): a relay that
// containers reach, on the gateway address of their Docker network, such as a
// standby's replication connection to its primary.
func StartOn(t testing.TB, addr, target string) *Relay {
	t.Helper()
	r, err := Listen(addr, target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// Listen is StartOn for a relay that outlives one test (one shared by a test
// package): the caller closes it.
func Listen(addr, target string) (*Relay, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("netrelay: listen: %w", err)
	}
	r := &Relay{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	r.cond = sync.NewCond(&r.mu)
	r.wg.Go(r.accept)
	return r, nil
}

// Addr is the relay's HOST:PORT.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// Port is the relay's port.
func (r *Relay) Port() int { return r.ln.Addr().(*net.TCPAddr).Port }

// Blackhole stops every byte, both ways, on every connection, open or new, without
// closing any: the peers see silence, as across a partition that drops packets. A
// connection made meanwhile is accepted and answered with nothing, and the target is
// not dialled until Restore: a host that vanished, whether or not the target is up.
func (r *Relay) Blackhole() { r.set(blackhole) }

// Cut resets every open connection and refuses new ones, as a network that answers
// with resets (or a host that is gone) would.
func (r *Relay) Cut() {
	r.set(cut)
	r.mu.Lock()
	for c := range r.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // RST rather than FIN
		}
		_ = c.Close()
	}
	r.mu.Unlock()
}

// Restore forwards again: held bytes flow, new connections are accepted and relayed.
func (r *Relay) Restore() { r.set(forward) }

// Close stops the relay and closes every connection.
func (r *Relay) Close() {
	_ = r.ln.Close()
	r.Cut()
	r.wg.Wait()
}

func (r *Relay) set(m mode) {
	r.mu.Lock()
	r.mode = m
	r.cond.Broadcast()
	r.mu.Unlock()
}

func (r *Relay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		refused := r.mode == cut
		r.mu.Unlock()
		if refused {
			_ = c.Close()
			continue
		}
		r.wg.Go(func() { r.serve(c) })
	}
}

// serve relays one client connection to a new connection to the target.
func (r *Relay) serve(client net.Conn) {
	if !r.track(client) {
		return
	}
	if !r.waitForward() {
		r.untrack(client)
		return
	}
	server, err := net.Dial("tcp", r.target)
	if err != nil {
		r.untrack(client)
		return
	}
	if !r.track(server) {
		r.untrack(client)
		return
	}
	var pipes sync.WaitGroup
	pipes.Go(func() { r.pipe(server, client) })
	pipes.Go(func() { r.pipe(client, server) })
	pipes.Wait()
	r.untrack(client, server)
}

// track registers a connection pair, or closes it when the relay is cut meanwhile.
func (r *Relay) track(cs ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mode == cut {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	for _, c := range cs {
		r.conns[c] = struct{}{}
	}
	return true
}

func (r *Relay) untrack(cs ...net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range cs {
		delete(r.conns, c)
		_ = c.Close()
	}
}

// pipe copies from src to dst, holding each chunk while the relay is a black hole.
func (r *Relay) pipe(dst, src net.Conn) {
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !r.waitForward() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a reset: the other direction ends with it
		}
	}
}

// waitForward blocks while the relay is a black hole; false once it is cut.
func (r *Relay) waitForward() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for r.mode == blackhole {
		r.cond.Wait()
	}
	return r.mode == forward
}
