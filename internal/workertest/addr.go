package workertest

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/certworker/certworker/internal/loopback"
)

// FreeAddr is a loopback address (127.0.0.1:PORT) nothing listens on, for a server a
// test starts later (a binary told the port on its command line, Pebble told where to
// validate), or for a peer that must refuse connections.
//
// Between FreeAddr and the server's bind the port is nobody's, so FreeAddr keeps out
// of the way of what else takes ports on a busy host: the port is below the kernel's
// ephemeral range, where neither an outgoing connection's source port nor Docker's
// published ports are chosen, and a lock file (held until the test ends) keeps
// another test process from being handed the same port.
func FreeAddr(t testing.TB) string {
	t.Helper()
	port, release, ok := reservePort()
	if !ok {
		return ephemeralAddr(t)
	}
	t.Cleanup(release)
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// ephemeralAddr is FreeAddr where no port can be reserved: one the kernel picks,
// closed again.
func ephemeralAddr(t testing.TB) string {
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

var reserved struct {
	sync.Mutex
	next int
}

// reservePort finds a port below the ephemeral range that this process holds the lock
// of and that TCP and UDP can both bind on 127.0.0.1 now.
func reservePort() (port int, release func(), ok bool) {
	lo, hi := reservableRange()
	if hi-lo < 1000 {
		return 0, nil, false
	}
	dir := lockDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, nil, false
	}
	reserved.Lock()
	defer reserved.Unlock()
	if reserved.next == 0 {
		// Processes start far apart in the range, so they rarely meet on a lock.
		reserved.next = lo + (os.Getpid()*7919)%(hi-lo)
	}
	for range hi - lo {
		port = reserved.next
		reserved.next++
		if reserved.next >= hi {
			reserved.next = lo
		}
		release, locked := lockPort(dir, port)
		if !locked {
			continue
		}
		if bindable(port) {
			return port, release, true
		}
		release()
	}
	return 0, nil, false
}

func lockDir() string { return filepath.Join(os.TempDir(), "certworker-test-ports") }

// reservableRange is [lo, hi): the ports from half the ephemeral range's start up to
// it (16384-32767 on Linux's defaults).
func reservableRange() (lo, hi int) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				hi = n
			}
		}
	}
	return max(hi/2, 1024), hi
}

func bindable(port int) bool {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	defer ln.Close()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	return pc.Close() == nil
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
