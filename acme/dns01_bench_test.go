package acme_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/acme"
)

// floodEnv, set to a server's address, makes the test binary a load generator
// (TestMain calls floodMain): a process of its own, so that the CPU the benchmark
// reads of its own process is the server's and not the flood's.
const floodEnv = "CERTWORKER_DNS01_FLOOD_ADDR"

// floodResult is what the load generator saw, printed as one JSON line.
type floodResult struct {
	Sent      int64       `json:"sent"`
	Answered  int64       `json:"answered"`
	Truncated int64       `json:"truncated"`
	Rcodes    map[int]int `json:"rcodes"`
}

// floodMain floods the zone server at addr over UDP with TXT questions for random
// target-shaped labels from 64 senders, each one after another with a 200 ms
// timeout, for floodFor, and prints a floodResult.
func floodMain(addr string) {
	var res floodResult
	res.Rcodes = map[int]int{}
	var mu sync.Mutex
	var sent, answered, truncated atomic.Int64
	deadline := time.Now().Add(floodFor)
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &dns.Client{Net: "udp", Timeout: 200 * time.Millisecond}
			for time.Now().Before(deadline) {
				m := new(dns.Msg)
				m.SetQuestion(randomHex(16)+"."+testZone+".", dns.TypeTXT)
				sent.Add(1)
				in, _, err := c.Exchange(m, addr)
				if err != nil {
					continue
				}
				answered.Add(1)
				if in.Truncated {
					truncated.Add(1)
				}
				mu.Lock()
				res.Rcodes[in.Rcode]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	res.Sent, res.Answered, res.Truncated = sent.Load(), answered.Load(), truncated.Load()
	_ = json.NewEncoder(os.Stdout).Encode(res)
}

// BenchmarkDNS01Flood floods one zone server on loopback with TXT questions for random
// target-shaped labels for 10 s, from a process of its own (64 UDP senders as fast as
// this machine answers them), with the values table holding 10,000 rows; once with
// the rate limit off (every question answered) and once at its default (20 a second
// from the flood's one source). A real value is asked over TCP every 100 ms from the
// benchmark's process meanwhile. It counts the server's reads of the values table
// (bound: one per read interval) and the CPU of the benchmark's process, which is the
// server's (with the pool's and the real questions' own small share). Results go to
// bench/dns01.txt.
func BenchmarkDNS01Flood(b *testing.B) {
	pool, _ := newTestPool(b)
	_, err := pool.Exec(context.Background(), `
INSERT INTO certworker_dns01_values (token, target, value, domain, expires_at)
SELECT 'filler-' || n, lpad(to_hex(n), 32, '0'), 'filler', 'filler.example', now() + interval '1 hour'
FROM generate_series(1, 10000) n`)
	require.NoError(b, err)
	putValue(b, pool, "real.example", "real-value")
	real := acme.DNS01Target(testZone, "real.example")
	load := loadAverage()

	var out strings.Builder
	fmt.Fprintf(&out, "# DNS-01 zone server under a flood: TXT questions for random 32-hex labels under the zone, over UDP\n")
	fmt.Fprintf(&out, "# from 64 senders one after another (200 ms timeout) for %s, in a process of their own; the values\n", floodFor)
	fmt.Fprintf(&out, "# table holds 10,000 rows; a real value asked over TCP every 100 ms from the server's process.\n")
	fmt.Fprintf(&out, "# Load generator, server and PostgreSQL share the machine. Reads: the server's reads of certworker_dns01_values.\n")
	fmt.Fprintf(&out, "# Server CPU: user+system time of the benchmark's process (the server, its pool, the real questions) over the flood.\n")
	fmt.Fprintf(&out, "# %s, %s %s/%s, %d CPUs; load average (1 min) %s at the start\n",
		time.Now().UTC().Format(time.RFC3339), runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), load)
	fmt.Fprintf(&out, "# command: CERTWORKER_PG_IMAGE=certworker-postgres:15 go test -run '^$' -bench DNS01Flood -benchtime 1x -timeout 10m ./acme/\n")
	for _, rrl := range []int{0, acme.DefaultDNS01RateLimit} {
		s, addr := startDNS01(b, pool, acme.DNS01Options{RateLimit: rrl, RateLimitSlip: acme.DefaultDNS01RateLimitSlip})
		before := s.Reads()
		cpu0 := processCPU()
		start := time.Now()
		flood := exec.Command(os.Args[0], "-test.run=^$")
		flood.Env = append(os.Environ(), floodEnv+"="+addr)
		var stdout strings.Builder
		flood.Stdout = &stdout
		require.NoError(b, flood.Start())
		var realAsked, realSeen int
		tick := time.NewTicker(100 * time.Millisecond)
		done := make(chan error, 1)
		go func() { done <- flood.Wait() }()
	asking:
		for {
			select {
			case err := <-done:
				require.NoError(b, err)
				break asking
			case <-tick.C:
				realAsked++
				m := new(dns.Msg)
				m.SetQuestion(real+".", dns.TypeTXT)
				in, _, err := (&dns.Client{Net: "tcp", Timeout: 2 * time.Second}).Exchange(m, addr)
				if err == nil && len(in.Answer) == 1 {
					realSeen++
				}
			}
		}
		tick.Stop()
		elapsed := time.Since(start)
		serverCPU := processCPU() - cpu0
		floodCPU := childCPU(flood.ProcessState)
		reads := s.Reads() - before
		s.Shutdown()
		var res floodResult
		require.NoError(b, json.Unmarshal([]byte(stdout.String()), &res), stdout.String())
		require.Equal(b, realAsked, realSeen, "the real value is answered during the flood")
		require.LessOrEqual(b, reads, int64(elapsed/acme.DefaultDNS01ReadInterval)+2)

		limit := "off"
		if rrl > 0 {
			limit = fmt.Sprintf("%d a second per source prefix, slip %d", rrl, acme.DefaultDNS01RateLimitSlip)
		}
		fmt.Fprintf(&out, "\n## rate limit %s\n", limit)
		fmt.Fprintf(&out, "flood: %d questions sent, %d answered (%d of them truncated) in %.1f s = %.0f answers/s; rcodes %v (3 = NXDOMAIN)\n",
			res.Sent, res.Answered, res.Truncated, elapsed.Seconds(), float64(res.Answered)/elapsed.Seconds(), res.Rcodes)
		fmt.Fprintf(&out, "database reads: %d in %.1f s (%.1f a second; bound: one per %s = %.0f a second)\n",
			reads, elapsed.Seconds(), float64(reads)/elapsed.Seconds(), acme.DefaultDNS01ReadInterval, float64(time.Second/acme.DefaultDNS01ReadInterval))
		fmt.Fprintf(&out, "server CPU: %.2f s in %.1f s = %.0f%% of one core; the load generator's: %.2f s\n",
			serverCPU.Seconds(), elapsed.Seconds(), 100*serverCPU.Seconds()/elapsed.Seconds(), floodCPU.Seconds())
		fmt.Fprintf(&out, "the real value (TCP): answered %d times of %d during the flood\n", realSeen, realAsked)
	}
	fmt.Fprintf(&out, "\nload average (1 min) at the end: %s\n", loadAverage())
	b.Log("\n" + out.String())
	require.NoError(b, os.WriteFile(filepath.Join("..", "bench", "dns01.txt"), []byte(out.String()), 0o644))
}

// processCPU is the user and system time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// childCPU is the user and system time an exited child used.
func childCPU(ps *os.ProcessState) time.Duration {
	if ps == nil {
		return 0
	}
	return ps.UserTime() + ps.SystemTime()
}
