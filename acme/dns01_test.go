package acme_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

const testZone = "acme.certworker.test"

// startDNS01 serves testZone from pool on a loopback port (UDP and TCP alike) and
// returns its address.
func startDNS01(t testing.TB, pool *pgxpool.Pool, opts acme.DNS01Options) (*acme.DNS01Server, string) {
	t.Helper()
	if opts.Zone == "" {
		opts.Zone = testZone
	}
	if opts.Nameservers == nil {
		opts.Nameservers = []string{"ns1.certworker.test", "ns2.certworker.test"}
	}
	s, err := acme.NewDNS01Server(pool, zap.NewNop(), opts)
	require.NoError(t, err)
	pc, ln := workertest.ListenUDPAndTCP(t)
	require.NoError(t, s.Serve(pc, ln))
	t.Cleanup(s.Shutdown)
	return s, ln.Addr().String()
}

// ask sends one question over network (udp or tcp) and returns the answer.
func ask(t *testing.T, network, addr, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.RecursionDesired = true
	c := &dns.Client{Net: network, Timeout: 10 * time.Second}
	in, _, err := c.Exchange(m, addr)
	require.NoError(t, err)
	return in
}

// putValue writes a TXT value at domain's target, as an order (of any instance) does.
func putValue(t testing.TB, pool *pgxpool.Pool, domain, value string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
INSERT INTO certworker_dns01_values (token, target, value, domain, expires_at)
VALUES ($1, $2, $3, $4, now() + interval '1 hour')`,
		randomHex(8), strings.TrimSuffix(acme.DNS01Target(testZone, domain), "."+testZone), value, domain)
	require.NoError(t, err)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// The zone's answers, over UDP and TCP alike, are docs/cas.md's: SOA and NS at the
// apex with a short negative TTL, the TXT values of orders in flight at each target
// with a TTL of seconds, NXDOMAIN with the SOA for a name it does not hold, NOERROR
// without data for another type, REFUSED outside the zone and no recursion offered.
// Guards against an open resolver, a negative answer cached for long (the CA's
// resolver would not see a value written a moment later), and a value written by
// another instance not being answered.
func TestDNS01Server_AnswersAsTheContractSays(t *testing.T) {
	t.Parallel()
	pool, dsn := newTestPool(t)
	_, addr := startDNS01(t, pool, acme.DNS01Options{})
	other, err := pgxpool.New(context.Background(), dsn) // another instance's order
	require.NoError(t, err)
	t.Cleanup(other.Close)
	putValue(t, other, "shop.example", "value-one")
	putValue(t, other, "*.shop.example", "value-two")
	target := acme.DNS01Target(testZone, "shop.example")

	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			soa := ask(t, network, addr, testZone, dns.TypeSOA)
			require.Equal(t, dns.RcodeSuccess, soa.Rcode)
			require.True(t, soa.Authoritative)
			require.False(t, soa.RecursionAvailable)
			require.Len(t, soa.Answer, 1)
			s := soa.Answer[0].(*dns.SOA)
			require.LessOrEqual(t, s.Minttl, uint32(5), "negative TTL")
			require.Equal(t, "ns1.certworker.test.", s.Ns)

			ns := ask(t, network, addr, testZone, dns.TypeNS)
			require.Equal(t, dns.RcodeSuccess, ns.Rcode)
			var names []string
			for _, rr := range ns.Answer {
				names = append(names, rr.(*dns.NS).Ns)
			}
			require.Equal(t, []string{"ns1.certworker.test.", "ns2.certworker.test."}, names)

			apexTXT := ask(t, network, addr, testZone, dns.TypeTXT)
			require.Equal(t, dns.RcodeSuccess, apexTXT.Rcode)
			require.Empty(t, apexTXT.Answer)

			txt := ask(t, network, addr, strings.ToUpper(target), dns.TypeTXT)
			require.Equal(t, dns.RcodeSuccess, txt.Rcode)
			require.True(t, txt.Authoritative)
			var values []string
			for _, rr := range txt.Answer {
				tx := rr.(*dns.TXT)
				require.LessOrEqual(t, tx.Hdr.Ttl, uint32(10))
				require.Positive(t, tx.Hdr.Ttl)
				values = append(values, tx.Txt...)
			}
			require.ElementsMatch(t, []string{"value-one", "value-two"}, values, "NAME and *.NAME share the target")

			a := ask(t, network, addr, target, dns.TypeA)
			require.Equal(t, dns.RcodeSuccess, a.Rcode)
			require.Empty(t, a.Answer)
			require.Len(t, a.Ns, 1)

			for _, missing := range []string{acme.DNS01Target(testZone, "nothing.example"), "www." + testZone, "x." + target} {
				nx := ask(t, network, addr, missing, dns.TypeTXT)
				require.Equal(t, dns.RcodeNameError, nx.Rcode, missing)
				require.Len(t, nx.Ns, 1, missing)
				require.LessOrEqual(t, nx.Ns[0].(*dns.SOA).Minttl, uint32(5))
			}

			for _, outside := range []string{"example.com", "certworker.test", "evilacme.certworker.test"} {
				ref := ask(t, network, addr, outside, dns.TypeA)
				require.Equal(t, dns.RcodeRefused, ref.Rcode, outside)
				require.Empty(t, ref.Answer, outside)
				require.False(t, ref.RecursionAvailable)
			}
		})
	}
}

// A value's row deleted (the order is over) is no longer answered: every answer comes
// from a read that began after the question. Guards against a stale copy served.
func TestDNS01Server_AnswersFromAReadAfterTheQuestion(t *testing.T) {
	t.Parallel()
	pool, _ := newTestPool(t)
	_, addr := startDNS01(t, pool, acme.DNS01Options{})
	target := acme.DNS01Target(testZone, "fresh.example")
	require.Equal(t, dns.RcodeNameError, ask(t, "udp", addr, target, dns.TypeTXT).Rcode)
	putValue(t, pool, "fresh.example", "now-here")
	require.Len(t, ask(t, "udp", addr, target, dns.TypeTXT).Answer, 1, "a value written after a negative answer is seen at once")
	_, err := pool.Exec(context.Background(), `DELETE FROM certworker_dns01_values`)
	require.NoError(t, err)
	require.Equal(t, dns.RcodeNameError, ask(t, "udp", addr, target, dns.TypeTXT).Rcode)
}

// While the database cannot be reached, a question below the apex is SERVFAIL (the
// CA's resolver asks again), never NXDOMAIN (which it would take as final), and the
// apex still answers. Guards against a database error shown or a false negative.
func TestDNS01Server_DatabaseUnreachableIsServfail(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(),
		"postgres://certworker:hunter2secret@"+workertest.FreeAddr(t)+"/certworker?sslmode=disable&connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, addr := startDNS01(t, pool, acme.DNS01Options{})
	for _, network := range []string{"udp", "tcp"} {
		in := ask(t, network, addr, acme.DNS01Target(testZone, "down.example"), dns.TypeTXT)
		require.Equal(t, dns.RcodeServerFailure, in.Rcode, network)
		require.Empty(t, in.Answer)
		require.Empty(t, in.Extra)
		require.Equal(t, dns.RcodeSuccess, ask(t, network, addr, testZone, dns.TypeSOA).Rcode)
	}
}

// A flood of random labels under the zone costs the database at most one read per
// read interval, however many questions: each question waits for the next read
// rather than making one. Guards against a query per label (a flood of random names
// would then be a flood of the proxy's database).
func TestDNS01Server_FloodOfRandomLabelsReadsBoundedly(t *testing.T) {
	t.Parallel()
	pool, _ := newTestPool(t)
	interval := 100 * time.Millisecond
	s, addr := startDNS01(t, pool, acme.DNS01Options{ReadInterval: interval})
	putValue(t, pool, "real.example", "real-value")
	before := s.Reads()
	start := time.Now()
	const questions = 1500
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for i := range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &dns.Client{Net: "udp", Timeout: 10 * time.Second}
			if i%2 == 1 {
				c.Net = "tcp"
			}
			for range questions / 30 {
				m := new(dns.Msg)
				m.SetQuestion(randomHex(16)+"."+testZone+".", dns.TypeTXT)
				in, _, err := c.Exchange(m, addr)
				if err != nil {
					continue
				}
				mu.Lock()
				codes[in.Rcode]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	reads := s.Reads() - before
	bound := int64(elapsed/interval) + 2
	t.Logf("%d questions in %s: %d reads (bound %d), rcodes %v", questions, elapsed, reads, bound, codes)
	require.LessOrEqual(t, reads, bound)
	require.Greater(t, codes[dns.RcodeNameError], questions/2, "random labels are NXDOMAIN")
	require.Zero(t, codes[dns.RcodeServerFailure])
	in := ask(t, "udp", addr, acme.DNS01Target(testZone, "real.example"), dns.TypeTXT)
	require.Len(t, in.Answer, 1, "the flood leaves real values answered")
}

// Answers are bounded: at most a handful of values at a target, and a UDP answer
// larger than the client's buffer (512 bytes without EDNS0) is truncated, so that the
// client asks again over TCP. Guards against the zone amplifying a spoofed query.
func TestDNS01Server_BoundedAnswersTruncatedOverUDP(t *testing.T) {
	t.Parallel()
	pool, _ := newTestPool(t)
	_, addr := startDNS01(t, pool, acme.DNS01Options{})
	for range 20 {
		putValue(t, pool, "big.example", strings.Repeat("v", 200)+randomHex(8))
	}
	target := acme.DNS01Target(testZone, "big.example")
	udp := ask(t, "udp", addr, target, dns.TypeTXT)
	require.True(t, udp.Truncated)
	packed, err := udp.Pack()
	require.NoError(t, err)
	require.LessOrEqual(t, len(packed), 512)
	tcp := ask(t, "tcp", addr, target, dns.TypeTXT)
	require.False(t, tcp.Truncated)
	require.Len(t, tcp.Answer, 8, "at most 8 values at a target")
}

// acme.DNS01Target and certworker_dns01_target agree, for NAME and *.NAME in any
// case, and the database function is NULL while no zone is recorded. Guards against
// the proxy showing the tenant a target the server does not answer.
func TestDNS01Target_MatchesTheDatabaseFunction(t *testing.T) {
	t.Parallel()
	pool, _ := newTestPool(t)
	ctx := context.Background()
	var got *string
	require.NoError(t, pool.QueryRow(ctx, `SELECT certworker_dns01_target('shop.example')`).Scan(&got))
	require.Nil(t, got, "NULL while DNS-01 is off")
	q := queue.New(pool, issuing.DefaultConfig())
	require.NoError(t, q.RecordDNS01Zone(ctx, "ACME.certworker.test."))
	want := acme.DNS01Target(testZone, "shop.example")
	require.True(t, strings.HasSuffix(want, "."+testZone))
	for _, name := range []string{"shop.example", "SHOP.Example", "*.shop.example"} {
		require.NoError(t, pool.QueryRow(ctx, `SELECT certworker_dns01_target($1)`, name).Scan(&got))
		require.NotNil(t, got)
		require.Equal(t, want, *got, name)
		require.Equal(t, want, acme.DNS01Target(testZone, name), name)
	}
	require.NotEqual(t, want, acme.DNS01Target(testZone, "other.example"))
	require.NotContains(t, want, "shop", "the target reveals nothing of the name")
	require.NoError(t, q.RecordDNS01Zone(ctx, ""))
	require.NoError(t, pool.QueryRow(ctx, `SELECT certworker_dns01_target('shop.example')`).Scan(&got))
	require.Nil(t, got)
}

// The TXT value is RFC 8555 §8.4's: base64url(SHA-256(key authorization)), checked
// against the RFC's own construction by hand.
func TestDNS01Value_IsTheDigestOfTheKeyAuthorization(t *testing.T) {
	t.Parallel()
	// SHA-256("token.thumbprint") in base64url, computed with openssl.
	require.Equal(t, "61rBZ_4knHblO0MNoxFsXZ_eTFUHum0B6IVRbhvUn5I", acme.DNS01Value("token.thumbprint"))
}

// A name server inside the zone given with its addresses (NAME=ADDRESS) is answered
// by the zone itself: A and AAAA at its name, and as glue beside the NS records. One
// given without an address is a warning at start naming the glue the parent zone must
// hold. Guards against in-zone name servers accepted and then answered NXDOMAIN, a
// lame delegation once resolvers stop trusting the parent's copy of the glue.
func TestDNS01Server_AnswersItsNameServersInsideTheZone(t *testing.T) {
	t.Parallel()
	pool, _ := newTestPool(t)
	ns1 := "ns1." + testZone
	_, addr := startDNS01(t, pool, acme.DNS01Options{Nameservers: []string{
		ns1 + "=127.0.0.53", strings.ToUpper(ns1) + ".=2001:db8::53", "ns2.certworker.test",
	}})
	for _, network := range []string{"udp", "tcp"} {
		a := ask(t, network, addr, ns1, dns.TypeA)
		require.Equal(t, dns.RcodeSuccess, a.Rcode, network)
		require.True(t, a.Authoritative)
		require.Len(t, a.Answer, 1)
		require.Equal(t, "127.0.0.53", a.Answer[0].(*dns.A).A.String())

		aaaa := ask(t, network, addr, strings.ToUpper(ns1), dns.TypeAAAA)
		require.Equal(t, dns.RcodeSuccess, aaaa.Rcode, network)
		require.Len(t, aaaa.Answer, 1)
		require.Equal(t, "2001:db8::53", aaaa.Answer[0].(*dns.AAAA).AAAA.String())

		txt := ask(t, network, addr, ns1, dns.TypeTXT)
		require.Equal(t, dns.RcodeSuccess, txt.Rcode, "the name exists, not the type")
		require.Empty(t, txt.Answer)

		ns := ask(t, network, addr, testZone, dns.TypeNS)
		var names []string
		for _, rr := range ns.Answer {
			names = append(names, rr.(*dns.NS).Ns)
		}
		require.Equal(t, []string{ns1 + ".", "ns2.certworker.test."}, names)
		require.Len(t, ns.Extra, 2, "the in-zone server's addresses as glue: %v", ns.Extra)

		other := ask(t, network, addr, "ns3."+testZone, dns.TypeA)
		require.Equal(t, dns.RcodeNameError, other.Rcode)
	}
}

// An in-zone name server without an address starts, with a warning naming the glue
// records the parent zone must hold; an address for a name outside the zone, or
// one that is not an address, is refused naming the flag.
func TestDNS01Server_NameServerInsideTheZoneWithoutAddressWarns(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zap.WarnLevel)
	ns1 := "ns1." + testZone
	_, err := acme.NewDNS01Server(nil, zap.New(core), acme.DNS01Options{
		Zone: testZone, Nameservers: []string{ns1, "ns2.certworker.test"}})
	require.NoError(t, err)
	warned := logs.FilterField(zap.String("nameserver", ns1)).All()
	require.Len(t, warned, 1, "%v", logs.All())
	require.Contains(t, warned[0].Message, "glue")
	require.Contains(t, warned[0].ContextMap()["glue"], ns1+" A and/or AAAA")

	for _, bad := range [][]string{{"ns.elsewhere.test=192.0.2.1"}, {ns1 + "=not-an-address"}} {
		_, err := acme.NewDNS01Server(nil, zap.NewNop(), acme.DNS01Options{Zone: testZone, Nameservers: bad})
		require.ErrorContains(t, err, "--dns01-nameservers", "%v", bad)
	}
}

// A value is answered whatever else the table holds: with 10,000 rows at other targets
// (orders in flight, or a table filled by mistake), a target sorting after all of
// them is still answered, and a read costs the same. Guards against a read of the
// whole table cut at 10,000 rows, which left every target past the cut NXDOMAIN.
func TestDNS01Server_AnswersATargetWhateverTheTableHolds(t *testing.T) {
	t.Parallel()
	pool, _ := newTestPool(t)
	_, addr := startDNS01(t, pool, acme.DNS01Options{})
	_, err := pool.Exec(context.Background(), `
INSERT INTO certworker_dns01_values (token, target, value, domain, expires_at)
SELECT 'filler-' || n, lpad(to_hex(n), 32, '0'), 'filler', 'filler.example', now() + interval '1 hour'
FROM generate_series(1, 10000) n`)
	require.NoError(t, err)
	var name string
	for n := 0; ; n++ { // a name whose target sorts after every filler's
		name = fmt.Sprintf("late-%d.example", n)
		if acme.DNS01Target(testZone, name) > "1" {
			break
		}
	}
	putValue(t, pool, name, "late-value")
	in := ask(t, "udp", addr, acme.DNS01Target(testZone, name), dns.TypeTXT)
	require.Equal(t, dns.RcodeSuccess, in.Rcode)
	require.Len(t, in.Answer, 1)
	require.Equal(t, []string{"late-value"}, in.Answer[0].(*dns.TXT).Txt)
}
