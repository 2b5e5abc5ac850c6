package pebbletest

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/letsencrypt/challtestsrv"
	"github.com/miekg/dns"
)

// The DNS server Pebble's VA resolves names with: challtestsrv, answering every A
// query with 127.0.0.1 and no AAAA query at all.
//
// One per process, shared by every CA, for two reasons that come from challtestsrv:
//   - it registers its handler on miekg/dns's process-wide default mux, so two
//     servers in one process would answer with whichever registered last;
//   - it is given an address and listens by itself, so a port chosen by the kernel
//     (":0") is not knowable; a port is picked free, then confirmed by a query.
//
// No AAAA answer: Pebble's VA dials the first address it resolved and asks AAAA
// first, so a "::1" answer (challtestsrv's default) would send every validation to
// an IPv6 loopback the worker's responder may not listen on.
var (
	dnsMu   sync.Mutex
	dnsAddr string
	dnsSrv  *challtestsrv.ChallSrv
)

// sharedDNS returns the address of the process's DNS server, starting it on first
// use. A failed start is retried on the next call.
func sharedDNS() (string, error) {
	dnsMu.Lock()
	defer dnsMu.Unlock()
	if dnsAddr != "" {
		return dnsAddr, nil
	}
	var lastErr error
	// The free port is released before challtestsrv binds it, so another process
	// can take it in between; a few attempts make that a non-issue.
	for range 5 {
		addr, err := freeUDPAndTCPPort()
		if err != nil {
			lastErr = err
			continue
		}
		srv, err := challtestsrv.New(challtestsrv.Config{
			DNSAddrs: []string{addr},
			Log:      log.New(io.Discard, "", 0),
		})
		if err != nil {
			return "", fmt.Errorf("challtestsrv: %w", err)
		}
		srv.SetDefaultDNSIPv4("127.0.0.1")
		srv.SetDefaultDNSIPv6("")
		srv.Run()
		if err := probeDNS(addr, 5*time.Second); err != nil {
			srv.Shutdown()
			lastErr = err
			continue
		}
		dnsAddr, dnsSrv = addr, srv
		return addr, nil
	}
	return "", fmt.Errorf("start DNS server: %w", lastErr)
}

// freeUDPAndTCPPort finds a loopback port free for both TCP and UDP at this moment.
func freeUDPAndTCPPort() (string, error) {
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		addr := ln.Addr().String()
		pc, err := net.ListenPacket("udp", addr)
		_ = ln.Close()
		if err != nil {
			continue
		}
		_ = pc.Close()
		return addr, nil
	}
	return "", errors.New("no loopback port free for both TCP and UDP")
}

// probeDNS waits until addr answers an A query over TCP (the transport Pebble's VA
// uses) with 127.0.0.1.
func probeDNS(addr string, within time.Duration) error {
	client := &dns.Client{Net: "tcp", Timeout: time.Second}
	deadline := time.Now().Add(within)
	var lastErr error
	for time.Now().Before(deadline) {
		m := new(dns.Msg)
		m.SetQuestion("probe.pebbletest.example.", dns.TypeA)
		in, _, err := client.Exchange(m, addr)
		if err == nil {
			for _, rr := range in.Answer {
				if a, ok := rr.(*dns.A); ok && a.A.Equal(net.IPv4(127, 0, 0, 1)) {
					return nil
				}
			}
			err = errors.New("no 127.0.0.1 answer")
		}
		lastErr = err
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("DNS server on %s does not answer: %w", addr, lastErr)
}

// freeTCPPort is a loopback TCP port free at this moment.
func freeTCPPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	_, port, err := net.SplitHostPort(ln.Addr().String())
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(port)
}

// DNS records of one name, for tests that need a name to resolve elsewhere than
// 127.0.0.1, or not at all. The server is the process's, so a test should only
// change names of its own (random ones), and ClearDNS them when it ends.

// SetA makes name resolve to the given IPv4 addresses, for the CA's VA and for
// anything else asking CA.DNSServer.
func SetA(name string, ips ...string) error {
	srv, err := dnsServer()
	if err != nil {
		return err
	}
	// challtestsrv adds to a name's records; a name is set, not added to.
	srv.DeleteDNSARecord(dns.Fqdn(name))
	srv.AddDNSARecord(dns.Fqdn(name), ips)
	return nil
}

// SetNoAddress makes name not exist: the server answers every query for it
// NXDOMAIN, as for a name whose DNS was never set up, or was taken down.
func SetNoAddress(name string) error {
	if _, err := dnsServer(); err != nil {
		return err
	}
	// challtestsrv has no NXDOMAIN (an empty answer from it, without the flags
	// of a recursive resolver, reads as a lame referral). Its handler is on
	// miekg/dns's default mux, where a more specific pattern wins.
	dns.HandleFunc(dns.Fqdn(name), func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeNameError)
		m.Authoritative, m.RecursionAvailable = true, true
		_ = w.WriteMsg(m)
	})
	return nil
}

// SetServFail makes every query for name fail with SERVFAIL, as a broken
// authoritative server does.
func SetServFail(name string) error {
	srv, err := dnsServer()
	if err != nil {
		return err
	}
	srv.AddDNSServFailRecord(dns.Fqdn(name))
	return nil
}

// CAA is a CAA record SetCAA serves: Flag 128 is the issuer critical flag.
type CAA struct {
	Flag  uint8
	Tag   string
	Value string
}

// SetCAA makes name's CAA RRset the given records (none: no CAA records), for a
// worker's CAA check that asks CA.DNSServer. Pebble's VA never asks for CAA.
//
// Records without flags are challtestsrv's, which follows a CNAME (SetCNAME) to
// them. A record with a flag is not something challtestsrv can serve: name is then
// answered by a handler of its own, which answers CAA queries with the records, A
// queries with 127.0.0.1 and other queries with nothing, and follows no alias to
// it. That handler answers the names under name too (miekg/dns's mux picks the
// longest zone), as names without CAA records.
func SetCAA(name string, records ...CAA) error {
	srv, err := dnsServer()
	if err != nil {
		return err
	}
	fqdn := dns.Fqdn(name)
	srv.DeleteDNSCAARecord(fqdn)
	dns.HandleRemove(fqdn)
	flagged := false
	var policies []challtestsrv.CAAPolicy
	for _, r := range records {
		flagged = flagged || r.Flag != 0
		policies = append(policies, challtestsrv.CAAPolicy{Tag: r.Tag, Value: r.Value})
	}
	if !flagged {
		if len(policies) > 0 {
			srv.AddDNSCAARecord(fqdn, policies)
		}
		return nil
	}
	dns.HandleFunc(fqdn, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative, m.RecursionAvailable = true, true
		for _, q := range r.Question {
			hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Rrtype: q.Qtype}
			switch q.Qtype {
			case dns.TypeCAA:
				if !strings.EqualFold(q.Name, fqdn) {
					continue
				}
				for _, rec := range records {
					m.Answer = append(m.Answer, &dns.CAA{Hdr: hdr, Flag: rec.Flag, Tag: rec.Tag, Value: rec.Value})
				}
			case dns.TypeA:
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: net.IPv4(127, 0, 0, 1)})
			}
		}
		_ = w.WriteMsg(m)
	})
	return nil
}

// SetCNAME makes name an alias of target: the server answers every query for name
// with the CNAME and target's records of the asked type (one level, as challtestsrv
// does).
func SetCNAME(name, target string) error {
	srv, err := dnsServer()
	if err != nil {
		return err
	}
	srv.AddDNSCNAMERecord(dns.Fqdn(name), dns.Fqdn(target))
	return nil
}

// ClearDNS puts name back to the default answer, 127.0.0.1, with no CAA records
// and no alias.
func ClearDNS(name string) {
	dnsMu.Lock()
	srv := dnsSrv
	dnsMu.Unlock()
	if srv == nil {
		return
	}
	srv.DeleteDNSARecord(dns.Fqdn(name))
	srv.DeleteDNSServFailRecord(dns.Fqdn(name))
	srv.DeleteDNSCAARecord(dns.Fqdn(name))
	srv.DeleteDNSCNAMERecord(dns.Fqdn(name))
	dns.HandleRemove(dns.Fqdn(name))
}

// dnsServer is the process's DNS server, started on first use.
func dnsServer() (*challtestsrv.ChallSrv, error) {
	if _, err := sharedDNS(); err != nil {
		return nil, err
	}
	dnsMu.Lock()
	defer dnsMu.Unlock()
	return dnsSrv, nil
}

// DNSAddress is the address (HOST:PORT) of the process's DNS server, started on
// first use: CA.DNSServer, for a test that needs the DNS without a CA.
func DNSAddress() (string, error) { return sharedDNS() }
