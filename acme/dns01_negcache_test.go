package acme_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/loopback"
	"github.com/certworker/certworker/queue/issuing"
)

// cachingResolver stands for a shared public resolver as far as caching goes
// (RFC 2308): it keeps each answer it gets from upstream, a positive one for the
// least TTL of its records, a negative one (NXDOMAIN, or no answer) for the least
// of its SOA's TTL and minimum, and answers from what it keeps, TTLs counted down. A
// CNAME's target is resolved through the same cache, so that a target asked for by
// its own name and through an alias share one entry.
type cachingResolver struct {
	addr     string
	upstream string

	mu    sync.Mutex
	cache map[string]cachedAnswer // by lower-case name and type
}

type cachedAnswer struct {
	msg     *dns.Msg
	stored  time.Time
	expires time.Time
}

func startCachingResolver(t *testing.T, upstream string) *cachingResolver {
	t.Helper()
	r := &cachingResolver{upstream: upstream, cache: map[string]cachedAnswer{}}
	pc, ln, err := loopback.ListenUDPAndTCP()
	require.NoError(t, err)
	r.addr = pc.LocalAddr().String()
	h := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		m := r.resolve(req.Question[0].Name, req.Question[0].Qtype, 0)
		m.SetRcode(req, m.Rcode)
		_ = w.WriteMsg(m)
	})
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		go func() { _ = srv.ActivateAndServe() }()
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
	return r
}

// resolve answers name's qtype from the cache, or from upstream, following a CNAME
// through the cache.
func (r *cachingResolver) resolve(name string, qtype uint16, depth int) *dns.Msg {
	key := strings.ToLower(name) + "/" + dns.TypeToString[qtype]
	now := time.Now()
	r.mu.Lock()
	c, ok := r.cache[key]
	r.mu.Unlock()
	if ok && now.Before(c.expires) {
		m := c.msg.Copy()
		age := uint32(now.Sub(c.stored) / time.Second)
		for _, rr := range append(m.Answer, m.Ns...) {
			rr.Header().Ttl -= min(age, rr.Header().Ttl)
		}
		return m
	}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), qtype)
	in, _, err := (&dns.Client{Net: "tcp", Timeout: 5 * time.Second}).Exchange(q, r.upstream)
	if err != nil {
		m := new(dns.Msg)
		m.Rcode = dns.RcodeServerFailure
		return m
	}
	if len(in.Answer) > 0 && qtype != dns.TypeCNAME && depth < 8 {
		if cn, ok := in.Answer[0].(*dns.CNAME); ok {
			target := r.resolve(cn.Target, qtype, depth+1)
			m := target.Copy()
			m.Answer = append([]dns.RR{cn}, target.Answer...)
			return m
		}
	}
	ttl := uint32(0)
	switch {
	case len(in.Answer) > 0:
		ttl = in.Answer[0].Header().Ttl
		for _, rr := range in.Answer {
			ttl = min(ttl, rr.Header().Ttl)
		}
	case len(in.Ns) > 0:
		if soa, ok := in.Ns[0].(*dns.SOA); ok {
			ttl = min(soa.Hdr.Ttl, soa.Minttl)
		}
	}
	if ttl > 0 {
		r.mu.Lock()
		r.cache[key] = cachedAnswer{msg: in.Copy(), stored: now, expires: now.Add(time.Duration(ttl) * time.Second)}
		r.mu.Unlock()
	}
	return in
}

// A wildcard is issued within 30 s although someone asks for its target every 50 ms
// through the resolver the preflight asks, keeping the target's NXDOMAIN (5 s) cached
// there: the preflight waits out the negative TTL it was given, its probe still in
// place, and asks again before it decides. Guards against a preflight that fails the
// name on one cached negative answer, which anyone can keep warm (the target is
// computable from the name), so that the name waits until --dns-wait-max.
func TestDNS01_PreflightOutlastsANegativeAnswerKeptWarm(t *testing.T) {
	t.Parallel()
	b := setupDNS01(t)
	shared := startCachingResolver(t, b.resolver.Addr)
	base := randomName("dns01-warm")
	name := "*." + base
	b.delegate(name)
	target := acme.DNS01Target(testZone, name)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // someone keeping the target's negative answer warm
		defer wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				m := new(dns.Msg)
				m.SetQuestion(target+".", dns.TypeTXT)
				_, _, _ = (&dns.Client{Net: "udp", Timeout: time.Second}).Exchange(m, shared.addr)
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	require.Eventually(t, func() bool { // the negative answer is cached before the first order
		m := new(dns.Msg)
		m.SetQuestion(target+".", dns.TypeTXT)
		in, _, err := (&dns.Client{Net: "udp", Timeout: time.Second}).Exchange(m, shared.addr)
		return err == nil && in.Rcode == dns.RcodeNameError
	}, 10*time.Second, 50*time.Millisecond)

	cfg := b.config()
	cfg.PreflightResolver = shared.addr
	iss := newIssuer(t, b.pool, nil, cfg)
	start := time.Now()
	attempts := 0
	for {
		attempts++
		_, err := iss.Issue(testCtx(t, 2*time.Minute), issuing.Request{Domain: name})
		if err == nil {
			break
		}
		var pe *issuing.PreflightError
		require.ErrorAs(t, err, &pe, "only the preflight may hold it back")
		require.Less(t, time.Since(start), 30*time.Second, "not issued within 30 s (%d attempts): %v", attempts, err)
		time.Sleep(time.Second) // the worker's next check of a waiting name
	}
	t.Logf("issued %s after %d attempts", time.Since(start), attempts)
}
