package acme_test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/acme"
)

// BenchmarkDNS01Flood floods one zone server on loopback with TXT questions for random
// target-shaped labels for 10 s, from 64 UDP senders as fast as this machine sends
// them, with a real value in the zone asked for now and then in the middle of it.
// It counts the server's reads of the values table: the bound is one per read
// interval (50 ms), whatever the flood. Results go to bench/dns01.txt.
func BenchmarkDNS01Flood(b *testing.B) {
	pool, _ := newTestPool(b)
	s, addr := startDNS01(b, pool, acme.DNS01Options{})
	putValue(b, pool, "real.example", "real-value")
	real := acme.DNS01Target(testZone, "real.example")
	load := loadAverage()
	before := s.Reads()
	deadline := time.Now().Add(floodFor)
	var sent, answered, realSeen, realAsked atomic.Int64
	var mu sync.Mutex
	rcodes := map[int]int{}
	var wg sync.WaitGroup
	start := time.Now()
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &dns.Client{Net: "udp", Timeout: 2 * time.Second}
			for n := 0; time.Now().Before(deadline); n++ {
				m := new(dns.Msg)
				name := randomHex(16) + "." + testZone + "."
				isReal := i == 0 && n%100 == 0
				if isReal {
					name = real + "."
					realAsked.Add(1)
				}
				m.SetQuestion(name, dns.TypeTXT)
				sent.Add(1)
				in, _, err := c.Exchange(m, addr)
				if err != nil {
					continue
				}
				answered.Add(1)
				if isReal && len(in.Answer) == 1 {
					realSeen.Add(1)
				}
				mu.Lock()
				rcodes[in.Rcode]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	reads := s.Reads() - before
	require.Equal(b, realAsked.Load(), realSeen.Load(), "the real value is answered during the flood")
	require.LessOrEqual(b, reads, int64(elapsed/acme.DefaultDNS01ReadInterval)+2)

	var out strings.Builder
	fmt.Fprintf(&out, "# DNS-01 zone server under a flood: TXT questions for random 32-hex labels under the zone, over UDP\n")
	fmt.Fprintf(&out, "# from 64 senders one after another for %s, a real value asked every 100th question of one sender.\n", floodFor)
	fmt.Fprintf(&out, "# Load generator, server and PostgreSQL share the machine. Reads: the server's reads of certworker_dns01_values.\n")
	fmt.Fprintf(&out, "# %s, %s %s/%s, %d CPUs; load average (1 min) %s at the start\n",
		time.Now().UTC().Format(time.RFC3339), runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), load)
	fmt.Fprintf(&out, "# command: CERTWORKER_PG_IMAGE=certworker-postgres:15 go test -run '^$' -bench DNS01Flood -benchtime 1x -timeout 10m ./acme/\n\n")
	fmt.Fprintf(&out, "flood: %d questions sent, %d answered in %.1f s = %.0f answers/s; rcodes %v (3 = NXDOMAIN)\n",
		sent.Load(), answered.Load(), elapsed.Seconds(), float64(answered.Load())/elapsed.Seconds(), rcodes)
	fmt.Fprintf(&out, "database reads: %d in %.1f s (%.1f a second; bound: one per %s = %.0f a second)\n",
		reads, elapsed.Seconds(), float64(reads)/elapsed.Seconds(), acme.DefaultDNS01ReadInterval, float64(time.Second/acme.DefaultDNS01ReadInterval))
	fmt.Fprintf(&out, "the real value: answered %d times of %d during the flood\n", realSeen.Load(), realAsked.Load())
	fmt.Fprintf(&out, "load average (1 min) at the end: %s\n", loadAverage())
	b.Log("\n" + out.String())
	require.NoError(b, os.WriteFile(filepath.Join("..", "bench", "dns01.txt"), []byte(out.String()), 0o644))
}
