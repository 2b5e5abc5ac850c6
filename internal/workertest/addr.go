package workertest

import (
	"net"
	"strconv"
	"testing"

	"github.com/certworker/certworker/internal/freeport"
	"github.com/certworker/certworker/internal/loopback"
)

// FreeAddr is a loopback address (127.0.0.1:PORT) nothing listens on, for a server a
// test starts later (a binary told the port on its command line, Pebble told where to
// validate), or for a peer that must refuse connections. Between FreeAddr and the
// server's bind the port is nobody's: freeport keeps it out of the way of what else
// takes ports on a busy host until the test ends.
func FreeAddr(t testing.TB) string {
	t.Helper()
	port, release, err := freeport.Pick()
	if err != nil {
		t.Fatalf("free address: %v", err)
	}
	t.Cleanup(release)
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// ListenUDPAndTCP listens on one loopback port for both UDP and TCP, as a DNS server
// does, and closes both when the test ends (a server that took them over closing
// them first is fine).
func ListenUDPAndTCP(t testing.TB) (net.PacketConn, net.Listener) {
	t.Helper()
	pc, ln, err := loopback.ListenUDPAndTCP()
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() { _ = ln.Close(); _ = pc.Close() })
	return pc, ln
}
