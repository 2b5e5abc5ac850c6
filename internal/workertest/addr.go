package workertest

import (
	"net"
	"testing"
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
