package acme_test

import (
	"math"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/workertest"
)

// exchangeRaw sends m over network and returns the answer and the sizes of the
// question and the answer as they crossed the wire.
func exchangeRaw(t *testing.T, network, addr string, m *dns.Msg) (*dns.Msg, int, int) {
	t.Helper()
	q, err := m.Pack()
	require.NoError(t, err)
	co, err := dns.Dial(network, addr)
	require.NoError(t, err)
	defer co.Close()
	require.NoError(t, co.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = co.Write(q)
	require.NoError(t, err)
	raw, err := co.ReadMsgHeader(nil)
	require.NoError(t, err)
	in := new(dns.Msg)
	require.NoError(t, in.Unpack(raw))
	return in, len(q), len(raw)
}

// ANY gets a minimal answer (RFC 8482): one synthesized HINFO at a name that exists,
// at most three times the question's size over UDP, with or without EDNS. Guards
// against the zone as an amplifier: ANY at the apex was answered with every NS and
// the SOA (7.1 times the question), at a target with every value (11.8 times).
func TestDNS01Server_AnyGetsAMinimalAnswer(t *testing.T) {
	t.Parallel()
	pool, _ := newTestPool(t)
	_, addr := startDNS01(t, pool, acme.DNS01Options{})
	for range 8 {
		putValue(t, pool, "many.example", randomHex(21))
	}
	for _, name := range []string{testZone, acme.DNS01Target(testZone, "many.example")} {
		for _, edns := range []bool{false, true} {
			m := new(dns.Msg)
			m.SetQuestion(dns.Fqdn(name), dns.TypeANY)
			if edns {
				m.SetEdns0(4096, false)
			}
			in, qsize, asize := exchangeRaw(t, "udp", addr, m)
			require.Equal(t, dns.RcodeSuccess, in.Rcode, name)
			require.False(t, in.Truncated, name)
			require.Len(t, in.Answer, 1, name)
			hinfo, ok := in.Answer[0].(*dns.HINFO)
			require.True(t, ok, "%s: %v", name, in.Answer[0])
			require.Equal(t, "RFC8482", hinfo.Cpu)
			require.LessOrEqual(t, asize, 3*qsize, "%s (EDNS %v): %d bytes for a %d-byte question", name, edns, asize, qsize)
		}
	}
	nx := ask(t, "udp", addr, acme.DNS01Target(testZone, "nothing.example"), dns.TypeANY)
	require.Equal(t, dns.RcodeNameError, nx.Rcode)
}

// Zone transfers are refused, over UDP and TCP, at the apex and below: the zone's
// content is the values of orders in flight, for no one to list. Guards against AXFR
// and IXFR answered NOERROR.
func TestDNS01Server_ZoneTransfersAreRefused(t *testing.T) {
	t.Parallel()
	pool, _ := newTestPool(t)
	_, addr := startDNS01(t, pool, acme.DNS01Options{})
	putValue(t, pool, "xfr.example", "value")
	for _, network := range []string{"udp", "tcp"} {
		for _, qtype := range []uint16{dns.TypeAXFR, dns.TypeIXFR} {
			for _, name := range []string{testZone, acme.DNS01Target(testZone, "xfr.example")} {
				in := ask(t, network, addr, name, qtype)
				require.Equal(t, dns.RcodeRefused, in.Rcode, "%s %s %s", network, dns.TypeToString[qtype], name)
				require.Empty(t, in.Answer)
			}
		}
	}
}

// EDNS as RFC 6891 says: a version above 0 is answered BADVERS with an OPT of version
// 0 and no data; two OPT records are FORMERR. Guards against a version 1 query
// answered as if it were 0, and a malformed one answered at all.
func TestDNS01Server_EDNSVersionAndOPTCount(t *testing.T) {
	t.Parallel()
	pool, _ := newTestPool(t)
	_, addr := startDNS01(t, pool, acme.DNS01Options{})
	for _, network := range []string{"udp", "tcp"} {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(testZone), dns.TypeSOA)
		m.SetEdns0(1232, false)
		m.IsEdns0().SetVersion(1)
		in, _, _ := exchangeRaw(t, network, addr, m)
		require.Equal(t, dns.RcodeBadVers, in.Rcode, network)
		require.Empty(t, in.Answer)
		opt := in.IsEdns0()
		require.NotNil(t, opt, network)
		require.Equal(t, uint8(0), opt.Version())

		two := new(dns.Msg)
		two.SetQuestion(dns.Fqdn(testZone), dns.TypeSOA)
		two.SetEdns0(1232, false)
		two.Extra = append(two.Extra, &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT, Class: 1232}})
		in, _, _ = exchangeRaw(t, network, addr, two)
		require.Equal(t, dns.RcodeFormatError, in.Rcode, network)
		require.Empty(t, in.Answer)
	}
}

// readAnswers calls got with each DNS message pc receives, from a goroutine of its
// own, until pc is closed or its read deadline passes; the channel is closed then.
func readAnswers(pc net.PacketConn, got func(*dns.Msg)) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			in := new(dns.Msg)
			if in.Unpack(buf[:n]) == nil {
				got(in)
			}
		}
	}()
	return done
}

// udpTally counts the answers a UDP source got: in full, or empty with TC.
type udpTally struct{ full, truncated int }

// floodFrom sends m from local (an address of 127/8) to addr count times, one every
// gap, and counts the answers until 300 ms after the last question.
// askFrom asks m over UDP from the address local and waits up to 30 s for the answer.
func askFrom(t *testing.T, local, addr string, m *dns.Msg) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: "udp", Timeout: 30 * time.Second,
		Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(local)}}}
	in, _, err := c.Exchange(m.Copy(), addr)
	require.NoError(t, err)
	return in
}

func floodFrom(t *testing.T, local, addr string, m *dns.Msg, count int, gap time.Duration) udpTally {
	t.Helper() // called from other goroutines too: t.Error, never t.FailNow
	var tally udpTally
	pc, err := net.ListenPacket("udp", local+":0")
	if err != nil {
		t.Error(err)
		return tally
	}
	defer pc.Close()
	to, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Error(err)
		return tally
	}
	q, err := m.Pack()
	if err != nil {
		t.Error(err)
		return tally
	}
	done := readAnswers(pc, func(in *dns.Msg) {
		if in.Truncated {
			tally.truncated++
		} else if len(in.Answer) > 0 {
			tally.full++
		}
	})
	for range count {
		if _, err := pc.WriteTo(q, to); err != nil {
			t.Error(err)
			break
		}
		time.Sleep(gap)
	}
	if err := pc.SetReadDeadline(time.Now().Add(300 * time.Millisecond)); err != nil {
		t.Error(err)
		_ = pc.Close()
	}
	<-done
	return tally
}

// UDP answers are rate-limited per source prefix: a source flooding the zone gets at
// most the rate in full, one limited answer in two empty with TC (so that a real
// resolver asks again over TCP) and nothing for the rest, while another /24 asking
// at the same time is answered in full, an exempt prefix is never limited, and TCP
// from the flooding source is answered. Guards against the zone reflecting a forged
// source's flood at its victim, and against one flooding source silencing the zone.
func TestDNS01Server_RateLimitsEachSourcePrefix(t *testing.T) {
	t.Parallel()
	pool, _ := newTestPool(t)
	const rate = 10
	// The limiter's decisions are read off the server's counters, not off the answers
	// that came back: a loaded host loses answers or sends them later than the tally
	// waits, and those are not the limiter's.
	reg := prometheus.NewRegistry()
	_, addr := startDNS01(t, pool, acme.DNS01Options{
		RateLimit: rate, RateLimitSlip: 2,
		RateLimitExempt: []netip.Prefix{netip.MustParsePrefix("127.2.0.0/16")},
		Registerer:      reg,
	})
	queries := func(reg *prometheus.Registry, result string) float64 {
		return workertest.Metric(t, reg, "certworker_dns01_queries_total", result)
	}
	soa := new(dns.Msg)
	soa.SetQuestion(dns.Fqdn(testZone), dns.TypeSOA)

	const flood, gap = 200, time.Millisecond // 1,000 a second for 0.2 s or more
	const others = 5
	started := time.Now()
	var flooder udpTally
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		flooder = floodFrom(t, "127.0.0.1", addr, soa, flood, gap)
	}()
	for i := range others {
		// Each waits for its answer as long as it takes.
		in := askFrom(t, "127.1.0.1", addr, soa)
		require.False(t, in.Truncated, "question %d of the other /24 was limited while the first flooded", i)
		require.NotEmpty(t, in.Answer, "question %d of the other /24", i)
	}
	wg.Wait()
	judged := func() float64 {
		return queries(reg, "answered") + queries(reg, "slipped") + queries(reg, "dropped")
	}
	workertest.Eventually(t, time.Minute, "every question of the flood judged by the server", func() bool {
		return judged() >= flood+others
	})
	elapsed := time.Since(started)
	answered := queries(reg, "answered") - others
	slipped, dropped := queries(reg, "slipped"), queries(reg, "dropped")
	t.Logf("flooding source: %v answered, %v slipped, %v dropped of %d in %s; received %d in full, %d truncated",
		answered, slipped, dropped, flood, elapsed, flooder.full, flooder.truncated)
	require.Equal(t, float64(flood+others), judged(), "questions judged")
	require.GreaterOrEqual(t, answered, float64(rate), "the burst is answered")
	require.LessOrEqual(t, answered, rate+rate*elapsed.Seconds()+1, "at most the rate in full")
	require.Equal(t, math.Floor((slipped+dropped)/2), slipped, "one limited answer in two is truncated")
	require.LessOrEqual(t, float64(flooder.truncated), slipped, "truncated answers received")
	require.LessOrEqual(t, float64(flooder.full), answered, "full answers received")

	require.Equal(t, dns.RcodeSuccess, ask(t, "tcp", addr, testZone, dns.TypeSOA).Rcode, "TCP is never limited")

	// An exempt prefix, on a server of its own (where none of the flood's questions
	// can arrive late): 100 questions at once, far over the rate, and the limiter
	// limits none. It counts every answer it limits; an answer a loaded host loses
	// (its socket's buffer full, or later than the 300 ms the tally waits) is not
	// the limiter's, so the answers are held only to more than a limited prefix
	// could get.
	exemptReg := prometheus.NewRegistry()
	_, exemptAddr := startDNS01(t, pool, acme.DNS01Options{
		RateLimit: rate, RateLimitSlip: 2,
		RateLimitExempt: []netip.Prefix{netip.MustParsePrefix("127.2.0.0/16")},
		Registerer:      exemptReg,
	})
	began := time.Now()
	exempt := floodFrom(t, "127.2.0.1", exemptAddr, soa, 100, 0)
	took := time.Since(began)
	t.Logf("exempt source: %d in full, %d truncated of 100 in %s", exempt.full, exempt.truncated, took)
	require.Zero(t, exempt.truncated, "an exempt prefix is never limited")
	require.Greater(t, float64(exempt.full), rate+rate*took.Seconds()+1, "an exempt prefix is never limited")
	require.Positive(t, queries(exemptReg, "answered"), "the server counted no answer: the counters read are not its")
	require.Zero(t, queries(exemptReg, "slipped")+queries(exemptReg, "dropped"), "an exempt prefix is never limited")
}
