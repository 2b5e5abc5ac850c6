package acme

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/loopback"
)

// stubDNS serves answer on a loopback port over UDP and TCP, with a mux of its own
// (challtestsrv's is the process's default one), until the test ends.
func stubDNS(t *testing.T, answer func(q dns.Question, tcp bool) (rrs []dns.RR, truncated bool)) string {
	t.Helper()
	pc, ln, err := loopback.ListenUDPAndTCP()
	require.NoError(t, err)
	handler := func(tcp bool) dns.HandlerFunc {
		return func(w dns.ResponseWriter, r *dns.Msg) {
			m := new(dns.Msg)
			m.SetReply(r)
			m.RecursionAvailable = true
			m.Compress = true // as resolvers do: a large answer fits in one TCP message
			for _, q := range r.Question {
				rrs, tc := answer(q, tcp)
				m.Answer = append(m.Answer, rrs...)
				m.Truncated = m.Truncated || tc
			}
			_ = w.WriteMsg(m)
		}
	}
	udp := &dns.Server{PacketConn: pc, Handler: handler(false)}
	tcp := &dns.Server{Listener: ln, Handler: handler(true)}
	go func() { _ = udp.ActivateAndServe() }()
	go func() { _ = tcp.ActivateAndServe() }()
	t.Cleanup(func() {
		_ = udp.Shutdown()
		_ = tcp.Shutdown()
	})
	return pc.LocalAddr().String()
}

func cname(owner, target string) dns.RR {
	return &dns.CNAME{Hdr: dns.RR_Header{Name: owner, Rrtype: dns.TypeCNAME, Class: dns.ClassINET}, Target: target}
}

func caa(owner, value string) dns.RR {
	return &dns.CAA{Hdr: dns.RR_Header{Name: owner, Rrtype: dns.TypeCAA, Class: dns.ClassINET}, Tag: "issue", Value: value}
}

// A resolver whose answer stops at the alias (a CNAME without its target's records,
// as an authoritative server or a minimal stub answers) is followed to the target;
// a loop of aliases ends in a failed look-up instead of spinning; an answer truncated
// over UDP is asked again over TCP. Guards against an alias read as "no records"
// (every CA allowed) when its target has some, and against a large RRset lost to
// truncation.
func TestCAAResolver_FollowsAliasesItselfAndRetriesOverTCP(t *testing.T) {
	t.Parallel()
	addr := stubDNS(t, func(q dns.Question, tcp bool) ([]dns.RR, bool) {
		switch strings.ToLower(q.Name) {
		case "shop.tenant.example.":
			return []dns.RR{cname(q.Name, "edge.provider.example.")}, false
		case "edge.provider.example.":
			return []dns.RR{caa(q.Name, "pebble-two.test")}, false
		case "loop.tenant.example.":
			return []dns.RR{cname(q.Name, "pool.tenant.example.")}, false
		case "pool.tenant.example.":
			return []dns.RR{cname(q.Name, "loop.tenant.example.")}, false
		case "big.tenant.example.":
			if !tcp {
				return nil, true
			}
			return []dns.RR{caa(q.Name, "pebble-one.test")}, false
		}
		return nil, false
	})
	r, err := NewCAAResolver(addr)
	require.NoError(t, err)
	one := CAAIssuer{Identities: []string{"pebble-one.test"}}
	two := CAAIssuer{Identities: []string{"pebble-two.test"}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	v, err := CheckCAA(ctx, r, "shop.tenant.example", one, two)
	require.NoError(t, err)
	require.Equal(t, "shop.tenant.example", v.Set.Domain)
	require.Equal(t, []bool{false, true}, v.Allowed)

	_, err = CheckCAA(ctx, r, "loop.tenant.example", one)
	var ce *CAAError
	require.True(t, errors.As(err, &ce), "%v", err)
	require.Contains(t, err.Error(), "caa: the CAA look-up of loop.tenant.example follows more than 8 aliases")

	v, err = CheckCAA(ctx, r, "big.tenant.example", one, two)
	require.NoError(t, err)
	require.Equal(t, []bool{true, false}, v.Allowed)
}
