package workertest

import (
	"net"
	"testing"

	"github.com/certworker/certworker/internal/loopback"
)

// FreeAddr is a loopback address (127.0.0.1:PORT) nothing listens on, for now: for a
// server a test starts later, or for a peer that must refuse connections.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free address: %v", err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatalf("free address: %v", err)
	}
	return addr
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
