// Package freeport hands tests loopback ports that nothing else on a busy host will
// take before the test's server binds them: a port below the kernel's ephemeral range
// (where neither an outgoing connection's source port nor Docker's published ports
// are chosen), that TCP and UDP can bind now, whose lock file this process holds so
// that no other test process is handed it.
package freeport

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// ErrNone is Reserve's error where no port can be reserved: no lock file can be
// taken on this system, or every port of the range is taken.
var ErrNone = errors.New("no port below the ephemeral range can be reserved")

var next struct {
	sync.Mutex
	port int
}

// Reserve finds a port below the ephemeral range that this process now holds the
// lock of and that TCP and UDP can both bind on 127.0.0.1. release gives the lock
// up; the kernel drops it when the process ends, however it ends.
func Reserve() (port int, release func(), err error) {
	lo, hi := Range()
	if hi-lo < 1000 {
		return 0, nil, ErrNone
	}
	dir := lockDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, nil, ErrNone
	}
	next.Lock()
	defer next.Unlock()
	if next.port == 0 {
		// Processes start far apart in the range, so they rarely meet on a lock.
		next.port = lo + (os.Getpid()*7919)%(hi-lo)
	}
	for range hi - lo {
		port = next.port
		next.port++
		if next.port >= hi {
			next.port = lo
		}
		release, locked := lock(dir, port)
		if !locked {
			continue
		}
		if bindable(port) {
			return port, release, nil
		}
		release()
	}
	return 0, nil, ErrNone
}

// Pick is Reserve, or, where no port can be reserved, a port the kernel picks (listened
// on and closed again, so nothing holds it, and release does nothing).
func Pick() (port int, release func(), err error) {
	if port, release, err = Reserve(); err == nil {
		return port, release, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, nil, fmt.Errorf("pick a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, func() {}, nil
}

func lockDir() string { return filepath.Join(os.TempDir(), "certworker-test-ports") }

// Range is [lo, hi): the ports from half the ephemeral range's start up to it
// (16384-32767 on Linux's defaults).
func Range() (lo, hi int) {
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
