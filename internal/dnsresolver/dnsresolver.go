// Package dnsresolver is a small recursive resolver for tests, standing where a
// tenant's DNS and the public resolvers stand in production: it answers the CNAMEs a
// test sets (a tenant's _acme-challenge delegation) together with the target's TXT,
// which it asks of certworker's DNS-01 listeners (round robin, as a resolver asks the
// NS of a delegated zone), and forwards every other question to an upstream server
// (challtestsrv, which holds the names' A and CAA records).
//
// Pebble's VA asks TXT at _acme-challenge.NAME over TCP, takes every TXT in the
// answer and follows no CNAME itself; a resolver in front of it is what follows one.
//
// It has its own dns.ServeMux: challtestsrv registers on miekg/dns's default mux,
// which is process-wide.
package dnsresolver

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/certworker/certworker/internal/loopback"
)

// Resolver is a running resolver. Its methods are safe for concurrent use.
type Resolver struct {
	// Addr is HOST:PORT, UDP and TCP alike.
	Addr string

	upstream string
	servers  []*dns.Server

	mu        sync.Mutex
	cnames    map[string]string // fully qualified, lower case
	listeners []string          // certworker's DNS-01 listeners
	zone      string            // the zone they serve, fully qualified
	next      atomic.Uint64
	asked     map[string]int // listener -> questions forwarded to it
}

// Start starts a resolver forwarding to upstream on a loopback port of its own.
func Start(upstream string) (*Resolver, error) {
	r := &Resolver{upstream: upstream, cnames: map[string]string{}, asked: map[string]int{}}
	mux := dns.NewServeMux()
	mux.HandleFunc(".", r.serve)
	pc, ln, err := loopback.ListenUDPAndTCP()
	if err != nil {
		return nil, fmt.Errorf("dnsresolver: %w", err)
	}
	r.Addr = ln.Addr().String()
	for _, srv := range []*dns.Server{{PacketConn: pc, Net: "udp", Handler: mux}, {Listener: ln, Net: "tcp", Handler: mux}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go func() { _ = srv.ActivateAndServe() }()
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			r.Close()
			_ = pc.Close()
			_ = ln.Close()
			return nil, errors.New("dnsresolver: did not start")
		}
		r.servers = append(r.servers, srv)
	}
	return r, nil
}

// Close stops the resolver.
func (r *Resolver) Close() {
	for _, s := range r.servers {
		_ = s.Shutdown()
	}
}

// Delegate says that names under zone are answered by the DNS-01 listeners at addrs
// (HOST:PORT each), asked in turn.
func (r *Resolver) Delegate(zone string, addrs ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.zone, r.listeners = dns.Fqdn(strings.ToLower(zone)), addrs
}

// SetCNAME makes name an alias of target; RemoveCNAME undoes it.
func (r *Resolver) SetCNAME(name, target string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cnames[dns.Fqdn(strings.ToLower(name))] = dns.Fqdn(strings.ToLower(target))
}

// RemoveCNAME removes name's alias.
func (r *Resolver) RemoveCNAME(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.cnames, dns.Fqdn(strings.ToLower(name)))
}

// Asked is how many questions each DNS-01 listener was asked, by address.
func (r *Resolver) Asked() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.asked))
	for k, v := range r.asked {
		out[k] = v
	}
	return out
}

func (r *Resolver) serve(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	m.RecursionAvailable = true
	if len(req.Question) != 1 {
		m.SetRcode(req, dns.RcodeFormatError)
		_ = w.WriteMsg(m)
		return
	}
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	r.mu.Lock()
	target, aliased := r.cnames[name]
	zone := r.zone
	r.mu.Unlock()
	switch {
	case aliased:
		m.Answer = append(m.Answer, &dns.CNAME{
			Hdr:    dns.RR_Header{Name: q.Name, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 5},
			Target: target,
		})
		if q.Qtype != dns.TypeCNAME {
			in, err := r.ask(target, q.Qtype, zone)
			if err != nil {
				m.SetRcode(req, dns.RcodeServerFailure)
				m.Answer = nil
				break
			}
			m.Answer = append(m.Answer, in.Answer...)
			if in.Rcode == dns.RcodeNameError {
				m.Rcode = dns.RcodeNameError
			}
		}
	default:
		in, err := r.ask(q.Name, q.Qtype, zone)
		if err != nil {
			m.SetRcode(req, dns.RcodeServerFailure)
			break
		}
		m.Answer, m.Ns, m.Rcode = in.Answer, in.Ns, in.Rcode
	}
	_ = w.WriteMsg(m)
}

// ask puts the question to the DNS-01 listeners for a name under the delegated zone
// (in turn), and to the upstream server otherwise, over TCP.
func (r *Resolver) ask(name string, qtype uint16, zone string) (*dns.Msg, error) {
	server := r.upstream
	if zone != "" && dns.IsSubDomain(zone, strings.ToLower(name)) {
		r.mu.Lock()
		if len(r.listeners) > 0 {
			server = r.listeners[int(r.next.Add(1))%len(r.listeners)]
			r.asked[server]++
		}
		r.mu.Unlock()
	}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	c := &dns.Client{Net: "tcp", Timeout: 5 * time.Second}
	in, _, err := c.Exchange(m, server)
	return in, err
}
