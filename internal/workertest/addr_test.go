package workertest

import (
	"net"
	"strconv"
	"testing"
)

// FreeAddr hands out a port below the kernel's ephemeral range (where a busy host's
// outgoing connections and Docker's published ports take theirs), one it can bind,
// and never the same one twice while a test holds it. Guards against the race that
// had a binary's --http01-listen find its port taken.
func TestFreeAddr_BelowTheEphemeralRangeAndNeverTwice(t *testing.T) {
	_, ephemeral := reservableRange()
	seen := map[string]bool{}
	for range 50 {
		addr := FreeAddr(t)
		host, port, err := net.SplitHostPort(addr)
		if err != nil || host != "127.0.0.1" {
			t.Fatalf("FreeAddr = %q", addr)
		}
		n, _ := strconv.Atoi(port)
		if n >= ephemeral || n < 1024 {
			t.Fatalf("port %d is not below the ephemeral range (from %d)", n, ephemeral)
		}
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("the port FreeAddr gave cannot be bound: %v", err)
		}
		_ = ln.Close()
	}
}

// A port another process holds the lock of is not handed out: the lock, not only
// this process's counter, keeps two test binaries apart.
func TestFreeAddr_SkipsAPortLockedElsewhere(t *testing.T) {
	port, release, ok := reservePort()
	if !ok {
		t.Skip("no port can be reserved on this system")
	}
	release()
	reserved.Lock()
	reserved.next = port
	reserved.Unlock()
	// Another holder of the lock file: a second descriptor's flock conflicts as a
	// second process's would.
	hold, locked := lockPort(lockDir(), port)
	if !locked {
		t.Fatalf("could not lock port %d", port)
	}
	defer hold()
	got := FreeAddr(t)
	if got == net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) {
		t.Fatalf("FreeAddr handed out %s, locked by another holder", got)
	}
}
