package acme

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"
)

// The resolvers wait for an answer as long as they mean to (dnsTimeout, 4 s a
// query), not miekg/dns's 2 s default read timeout, which a dns.Client without
// Timeout applies under a longer context: an answer that takes 2.5 s is taken by the
// CAA look-up and by the DNS-01 choice's CNAME look-up. Guards against a resolver
// slower than 2 s read as silent (the choice falling back to HTTP-01, a CAA look-up
// charged as timed out).
func TestResolvers_WaitTheirOwnTimeoutNotMiekgsDefault(t *testing.T) {
	t.Parallel()
	const slow = 2500 * time.Millisecond
	require.Greater(t, dnsTimeout, slow)
	addr := stubDNS(t, func(q dns.Question, _ bool) ([]dns.RR, bool) {
		time.Sleep(slow) // the resolver's delay under test
		switch q.Qtype {
		case dns.TypeCAA:
			return []dns.RR{caa(q.Name, "pebble-one.test")}, false
		case dns.TypeCNAME:
			return []dns.RR{cname(q.Name, "target.zone.example.")}, false
		}
		return nil, false
	})
	t.Run("caa", func(t *testing.T) {
		t.Parallel()
		r, err := NewCAAResolver(addr)
		require.NoError(t, err)
		v, err := CheckCAA(context.Background(), r, "slow.tenant.example", CAAIssuer{Identities: []string{"pebble-one.test"}})
		require.NoError(t, err)
		require.Equal(t, []bool{true}, v.Allowed)
	})
	t.Run("cname", func(t *testing.T) {
		t.Parallel()
		got, err := newDNSClient(addr).cname(context.Background(), "_acme-challenge.slow.tenant.example")
		require.NoError(t, err)
		require.Equal(t, "target.zone.example", got)
	})
}

// The DNS answer a waiting check stores (its fingerprint, compared with the next
// check's) is at most 1 KiB however many records the tenant's DNS answers: beyond
// that it is a hash, still different for a different answer. Guards against a
// tenant's 3,000 A records stored as 38 KB on its row at every check.
func TestDNSAnswer_StoredFingerprintIsBounded(t *testing.T) {
	t.Parallel()
	records := func(name string, n, salt int) []dns.RR {
		out := make([]dns.RR, n)
		for i := range out {
			out[i] = &dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET},
				A: net.IPv4(10, byte(salt), byte(i>>8), byte(i))}
		}
		return out
	}
	addr := stubDNS(t, func(q dns.Question, tcp bool) ([]dns.RR, bool) {
		if q.Qtype != dns.TypeA {
			return nil, false
		}
		var n, salt int
		_, _ = fmt.Sscanf(strings.SplitN(q.Name, ".", 2)[0], "n%d-s%d", &n, &salt)
		if n > 20 && !tcp {
			return nil, true
		}
		return records(q.Name, n, salt), false
	})
	i := &Issuer{dns: newDNSClient(addr)}
	ctx := context.Background()
	small := i.dnsAnswer(ctx, "n2-s1.tenant.example")
	require.Equal(t, "10.1.0.0 10.1.0.1", small, "a small answer is kept as it is")
	big := i.dnsAnswer(ctx, "n3000-s1.tenant.example")
	require.NotEmpty(t, big)
	require.LessOrEqual(t, len(big), 1024)
	require.Equal(t, big, i.dnsAnswer(ctx, "n3000-s1.tenant.example"), "the same answer, the same fingerprint")
	require.NotEqual(t, big, i.dnsAnswer(ctx, "n3000-s2.tenant.example"), "another answer, another fingerprint")
}
