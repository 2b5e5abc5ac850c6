package freeport

import (
	"net"
	"strconv"
	"testing"
)

// Reserve hands out a port below the kernel's ephemeral range (where a busy host's
// outgoing connections and Docker's published ports take theirs), one it can bind,
// and never the same one twice while it is held. Guards against the race that had a
// binary's --http01-listen find its port taken.
func TestReserve_BelowTheEphemeralRangeAndNeverTwice(t *testing.T) {
	lo, hi := Range()
	seen := map[int]bool{}
	for range 50 {
		port, release, err := Reserve()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(release)
		if port < lo || port >= hi {
			t.Fatalf("port %d is outside [%d, %d), below the ephemeral range", port, lo, hi)
		}
		if seen[port] {
			t.Fatalf("port %d handed out twice", port)
		}
		seen[port] = true
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("the port Reserve gave cannot be bound: %v", err)
		}
		_ = ln.Close()
	}
}

// A port whose lock another holder has is not handed out: the lock, not only this
// process's counter, keeps two test binaries apart.
func TestReserve_SkipsAPortLockedElsewhere(t *testing.T) {
	port, release, err := Reserve()
	if err != nil {
		t.Fatal(err)
	}
	release()
	next.Lock()
	next.port = port
	next.Unlock()
	// A second descriptor's flock conflicts as a second process's would.
	hold, locked := lock(lockDir(), port)
	if !locked {
		t.Fatalf("could not lock port %d", port)
	}
	defer hold()
	got, release, err := Reserve()
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if got == port {
		t.Fatalf("Reserve handed out %d, locked by another holder", got)
	}
}

// A port something listens on is not handed out, even with its lock free.
func TestReserve_SkipsAPortInUse(t *testing.T) {
	port, release, err := Reserve()
	if err != nil {
		t.Fatal(err)
	}
	release()
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	next.Lock()
	next.port = port
	next.Unlock()
	got, release, err := Reserve()
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if got == port {
		t.Fatalf("Reserve handed out %d, which a listener holds", got)
	}
}
