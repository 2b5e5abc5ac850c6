package acme

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// The zone's answers. A resolver caches what it is told: the TXT of an
// order must be seen by the CA seconds after it is written, and a name the resolver
// was told does not exist must exist for it seconds later, so both the TXT's TTL and
// the SOA minimum (the negative TTL, RFC 2308) are a few seconds. NS and the apex
// SOA change only with the operator's configuration.
const (
	dns01TXTTTL    = 5
	dns01NegTTL    = 5
	dns01ApexTTL   = 3600
	dns01SOASerial = 1

	// dns01MaxValues bounds the TXT values answered at one target: one per order in
	// flight for the name (its own and its wildcard's) and a preflight probe or two.
	// More can only be a table filled by mistake, and the answer stays small.
	dns01MaxValues = 8

	// dns01UDPSize is the largest UDP answer sent to a client that announces a
	// larger buffer (EDNS0): the DNS flag day 2020 figure, below any path's MTU.
	// Beyond it, and beyond 512 bytes to a client without EDNS0, the answer is
	// truncated (TC) and the client asks again over TCP: no amplification.
	dns01UDPSize = 1232

	// DefaultDNS01ReadInterval is the shortest gap between two reads of the values
	// table: whatever the flood of queries, a server reads the database at most
	// 1/interval times a second. Every answer below the apex is given from a read
	// that began after the query arrived, so that a value committed before the CA
	// asked is always seen; a query waits at most this long, the read under way
	// when it came and its own.
	DefaultDNS01ReadInterval = 50 * time.Millisecond

	// dns01ReadTimeout bounds a read; past it the database counts as unreachable
	// (SERVFAIL), and the CA's resolver asks again.
	dns01ReadTimeout = 3 * time.Second

	// dns01ValueTTL is how long a stored value is served if its instance dies
	// before deleting it (as tokenTTL for HTTP-01).
	dns01ValueTTL = time.Hour
)

// NormalizeDNS01Zone is --dns01-zone in the one form every part uses: lower case,
// without a trailing dot, so that the target shown to the tenant, the values an order
// writes and the names the server answers are hashed from the same string however the
// operator wrote it. "" stays "" (DNS-01 off). A zone that is not a domain name of at
// least two labels is an error naming the flag.
func NormalizeDNS01Zone(zone string) (string, error) {
	if zone == "" {
		return "", nil
	}
	norm := strings.ToLower(strings.TrimSuffix(strings.TrimSpace(zone), "."))
	if _, ok := dns.IsDomainName(norm); !ok || !strings.Contains(norm, ".") ||
		strings.Contains(norm, "..") || net.ParseIP(norm) != nil {
		return "", fmt.Errorf("--dns01-zone: %q is not a domain name of at least two labels", zone)
	}
	return norm, nil
}

// DNS01Target is the name under zone that _acme-challenge.NAME is pointed at by
// CNAME: the same for NAME and *.NAME, stable for the name as long as the zone is,
// and revealing nothing beyond it (a hash of the zone and the lower-cased base name,
// 128 bits in hex). It is certworker_dns01_target's value (migration 00021); the two
// must agree, and TestDNS01Target_MatchesTheDatabaseFunction holds them together.
// The result is in lower case, without a trailing dot; "" when zone is "".
func DNS01Target(zone, domain string) string {
	zone = strings.ToLower(strings.TrimSuffix(zone, "."))
	if zone == "" {
		return ""
	}
	return dns01Label(zone, domain) + "." + zone
}

// dns01Label is the target's first label.
func dns01Label(zone, domain string) string {
	base := strings.ToLower(strings.TrimPrefix(domain, "*."))
	sum := sha256.Sum256([]byte(zone + "/" + base))
	return hex.EncodeToString(sum[:16])
}

// DNS01Value is the TXT value of a DNS-01 challenge (RFC 8555 §8.4): the base64url
// SHA-256 digest of the key authorization. Computed here rather than by lego's
// dns01.GetRecord, which also resolves the challenge's FQDN through process-wide
// state.
func DNS01Value(keyAuth string) string {
	sum := sha256.Sum256([]byte(keyAuth))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// DNS01Options tune a DNS01Server.
type DNS01Options struct {
	// Zone is --dns01-zone; Nameservers are --dns01-nameservers, each NAME or
	// NAME=ADDRESS (ParseDNS01Nameservers).
	Zone        string
	Nameservers []string
	// ReadInterval is the shortest gap between two reads of the values table; 0 is
	// DefaultDNS01ReadInterval.
	ReadInterval time.Duration
	// RateLimit is --dns01-rate-limit: UDP answers a second to one source prefix
	// (dns01rrl.go); 0 limits none. One limited answer in RateLimitSlip
	// (--dns01-rate-limit-slip) goes out empty and truncated, the others are
	// dropped; with 0 all are dropped. RateLimitExempt (--dns01-rate-limit-exempt)
	// are never limited.
	RateLimit       int
	RateLimitSlip   int
	RateLimitExempt []netip.Prefix
	// MaxInflight bounds the questions waiting for a read of the values table at
	// once (0: DefaultDNS01MaxInflight); the excess is answered SERVFAIL at once.
	MaxInflight int
	// MaxTCPConns caps the open TCP connections (0: dns01MaxTCPConns).
	MaxTCPConns int
	// Registerer, if not nil, receives certworker_dns01_queries_total{result},
	// certworker_dns01_reads_total and the TCP connections' metrics.
	Registerer prometheus.Registerer
}

// DefaultDNS01MaxInflight bounds the questions waiting for a read at once. A read
// takes milliseconds and a question waits for at most one interval and one read,
// so a few hundred waiting is thousands of questions a second; past it the database
// is stalled, and each question more would only hold a goroutine (about 8 KiB with
// its message) until the read's timeout. Bounded, a stalled database costs at most
// 4 MiB however fast the questions come.
const DefaultDNS01MaxInflight = 512

// DNS01Nameserver is one of --dns01-nameservers: a host name, in lower case without
// the trailing dot, and the addresses the zone answers for it (only for a name
// inside the zone).
type DNS01Nameserver struct {
	Name  string
	Addrs []netip.Addr
}

// ParseDNS01Nameservers reads --dns01-nameservers for zone (normalised): each entry
// NAME or NAME=ADDRESS, a name given once per address. An address is the zone's to
// answer only for a name inside it; for one outside it, it is an error.
func ParseDNS01Nameservers(zone string, entries []string) ([]DNS01Nameserver, error) {
	var out []DNS01Nameserver
	index := map[string]int{}
	for _, e := range entries {
		e = strings.TrimSpace(e)
		name, addr, withAddr := strings.Cut(e, "=")
		name = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(name), "."))
		if _, ok := dns.IsDomainName(name); !ok || name == "" || net.ParseIP(name) != nil || strings.Contains(name, "..") {
			return nil, fmt.Errorf("--dns01-nameservers: %q is not a host name", e)
		}
		n, seen := index[name]
		if !seen {
			n = len(out)
			index[name] = n
			out = append(out, DNS01Nameserver{Name: name})
		}
		if !withAddr {
			continue
		}
		a, err := netip.ParseAddr(strings.TrimSpace(addr))
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("--dns01-nameservers: %q: %q is not an IP address", e, addr)
		}
		if zone != "" && !dns.IsSubDomain(zone, name) {
			return nil, fmt.Errorf("--dns01-nameservers: %q: an address is given only for a name server inside %s, whose address the zone answers; %s is outside it", e, zone, name)
		}
		out[n].Addrs = append(out[n].Addrs, a.Unmap())
	}
	if len(out) == 0 {
		return nil, errors.New("--dns01-nameservers: required with --dns01-zone")
	}
	return out, nil
}

// DNS01Server answers --dns01-zone authoritatively (docs/cas.md) over UDP and TCP,
// from certworker_dns01_values, on every instance alike: a value written by one
// instance's order is answered by all.
//
//   - SOA and NS at the apex; the apex holds no other data (NOERROR, no answer);
//   - A and AAAA at a name server inside the zone given with its address;
//   - TXT at a target holds its values, read from the database (a target has no
//     other type: NOERROR, no answer); a name the zone does not hold is NXDOMAIN, with
//     the SOA, whose minimum (5 s) is the negative TTL;
//   - a name outside the zone, another class or another opcode is REFUSED: it never
//     recurses, so it is no open resolver; zone transfers are REFUSED too;
//   - it amplifies nothing: ANY gets one synthesized HINFO (RFC 8482), answers are
//     bounded (dns01MaxValues), a UDP answer larger than the client's buffer is
//     truncated, and UDP answers are rate-limited per source prefix (dns01rrl.go);
//   - EDNS as RFC 6891 says: a version above 0 is BADVERS, two OPT records FORMERR;
//   - SERVFAIL while the database cannot be read, never its error; SERVFAIL at once
//     for a question beyond MaxInflight waiting for a read;
//   - TCP connections are capped and timed (dns01conn.go).
//
// The database is read for the target labels asked, all those asked since the last
// read in one statement, at most once per ReadInterval whatever the queries, and
// every answer below the apex comes from a read that began after its query arrived:
// a flood of random labels costs the database at most 1/ReadInterval reads a second,
// each an index look-up of the labels asked whatever the table holds, and no value
// committed before the CA asked is missed.
//
// UDP is read by a few goroutines of its own, which answer what needs no read
// themselves and start one goroutine per question waiting for a read, at most
// MaxInflight: no goroutine per packet. TCP is miekg/dns's server, with its own
// handler (miekg/dns's default mux is process-wide: challtestsrv registers on it).
type DNS01Server struct {
	pool  *pgxpool.Pool
	log   *zap.Logger
	zone  string // fully qualified, lower case
	ns    []string
	hosts map[string][]dns.RR // in-zone name servers' A and AAAA, by fully qualified name
	soa   *dns.SOA
	opts  DNS01Options
	m     dns01Metrics
	connM connMetrics
	rrl   *rateLimiter
	slots chan struct{} // one per question waiting for a read

	// ctx ends at Shutdown, and with it the reads and the questions waiting.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the UDP readers and the questions they started

	reads atomic.Int64

	mu sync.Mutex
	// next is the read the questions that came since the last one began wait for;
	// reading is true while a goroutine runs reads (readLoop); lastRead is when the
	// last read began. Guarded by mu.
	next     *dns01Read
	reading  bool
	lastRead time.Time

	runMu    sync.Mutex
	servers  []*dns.Server    // guarded by runMu
	pcs      []net.PacketConn // guarded by runMu
	limiters []*ConnLimiter   // guarded by runMu
}

// dns01Read is one read of the values table: the values at the target labels asked
// since the read before it began.
type dns01Read struct {
	labels map[string]struct{}
	done   chan struct{} // closed when values and err are set
	values map[string][]string
	err    error
}

// NewDNS01Server returns a server for opts.Zone reading pool's database. It does not
// listen: Serve does. A name server inside the zone given without an address is
// logged as a warning: the parent zone must then hold its glue.
func NewDNS01Server(pool *pgxpool.Pool, log *zap.Logger, opts DNS01Options) (*DNS01Server, error) {
	if log == nil {
		log = zap.NewNop()
	}
	norm, err := NormalizeDNS01Zone(opts.Zone)
	if err != nil {
		return nil, err
	}
	if norm == "" {
		return nil, errors.New("--dns01-zone: required")
	}
	zone := dns.Fqdn(norm)
	servers, err := ParseDNS01Nameservers(norm, opts.Nameservers)
	if err != nil {
		return nil, err
	}
	if opts.ReadInterval <= 0 {
		opts.ReadInterval = DefaultDNS01ReadInterval
	}
	if opts.MaxInflight <= 0 {
		opts.MaxInflight = DefaultDNS01MaxInflight
	}
	if opts.MaxTCPConns <= 0 {
		opts.MaxTCPConns = dns01MaxTCPConns
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &DNS01Server{
		pool: pool, log: log.Named("dns01"), zone: zone, opts: opts,
		hosts: map[string][]dns.RR{},
		m:     newDNS01Metrics(opts.Registerer),
		connM: newConnMetrics(opts.Registerer, "dns01"),
		rrl:   newRateLimiter(opts.RateLimit, opts.RateLimitSlip, opts.RateLimitExempt),
		slots: make(chan struct{}, opts.MaxInflight),
		ctx:   ctx, cancel: cancel,
	}
	for _, n := range servers {
		fq := dns.Fqdn(n.Name)
		s.ns = append(s.ns, fq)
		if !dns.IsSubDomain(zone, fq) {
			continue
		}
		if fq == zone {
			cancel()
			return nil, fmt.Errorf("--dns01-nameservers: %s is the zone itself, which holds no address", n.Name)
		}
		if len(n.Addrs) == 0 {
			s.log.Warn("a name server inside the zone has no address: the parent zone must hold its glue, or the delegation is lame once resolvers stop trusting the parent's copy; give it as NAME=ADDRESS for the zone to answer it",
				zap.String("nameserver", n.Name), zap.String("glue", n.Name+" A and/or AAAA, in the parent zone of "+norm))
			continue
		}
		for _, a := range n.Addrs {
			hdr := dns.RR_Header{Name: fq, Class: dns.ClassINET, Ttl: dns01ApexTTL}
			if a.Is4() {
				hdr.Rrtype = dns.TypeA
				s.hosts[fq] = append(s.hosts[fq], &dns.A{Hdr: hdr, A: a.AsSlice()})
			} else {
				hdr.Rrtype = dns.TypeAAAA
				s.hosts[fq] = append(s.hosts[fq], &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
			}
		}
	}
	s.soa = &dns.SOA{
		Hdr: dns.RR_Header{Name: zone, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: dns01NegTTL},
		Ns:  s.ns[0], Mbox: "hostmaster." + zone, Serial: dns01SOASerial,
		Refresh: 3600, Retry: 600, Expire: 86400, Minttl: dns01NegTTL,
	}
	return s, nil
}

// Zone is the zone served, fully qualified.
func (s *DNS01Server) Zone() string { return s.zone }

// Reads is how many times the server has read the values table.
func (s *DNS01Server) Reads() int64 { return s.reads.Load() }

// OpenTCP is how many TCP connections the server holds open.
func (s *DNS01Server) OpenTCP() int {
	s.runMu.Lock()
	defer s.runMu.Unlock()
	n := 0
	for _, l := range s.limiters {
		n += l.Open()
	}
	return n
}

// Serve answers on pc (UDP) and ln (TCP), either of which may be nil, until
// Shutdown, which closes them. It returns once both are being served.
func (s *DNS01Server) Serve(pc net.PacketConn, ln net.Listener) error {
	s.runMu.Lock()
	defer s.runMu.Unlock()
	if pc != nil {
		s.pcs = append(s.pcs, pc)
		for range dns01UDPReaders {
			s.wg.Add(1)
			go s.readUDP(pc)
		}
	}
	if ln == nil {
		return nil
	}
	limiter := &ConnLimiter{Listener: newTCPLimits(ln, dns01TCPTotal), max: s.opts.MaxTCPConns, m: s.connM}
	srv := &dns.Server{Listener: limiter, Net: "tcp", Handler: dns.HandlerFunc(s.serveTCP),
		ReadTimeout: dns01TCPIdle, WriteTimeout: dns01TCPIdle,
		IdleTimeout: func() time.Duration { return dns01TCPIdle }, MaxTCPQueries: 16}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	s.servers = append(s.servers, srv)
	s.limiters = append(s.limiters, limiter)
	go func() {
		if err := srv.ActivateAndServe(); err != nil {
			s.log.Warn("DNS-01 listener stopped", zap.String("net", srv.Net), zap.Error(err))
		}
	}()
	select {
	case <-started:
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("DNS-01 listener did not start")
	}
}

// Shutdown stops the listeners and ends the questions waiting for a read. Safe
// before Serve and twice.
func (s *DNS01Server) Shutdown() {
	s.runMu.Lock()
	defer s.runMu.Unlock()
	s.cancel()
	for _, pc := range s.pcs {
		_ = pc.Close()
	}
	for _, srv := range s.servers {
		_ = srv.Shutdown()
	}
	s.pcs, s.servers, s.limiters = nil, nil, nil
	s.wg.Wait()
}

// What a query came to, the label of certworker_dns01_queries_total.
const (
	dns01Answered = "answered" // data from the zone
	dns01NoData   = "nodata"   // the name exists, not the type
	dns01NXDomain = "nxdomain"
	dns01Refused  = "refused" // outside the zone, another class or opcode, a transfer
	dns01ServFail = "servfail"
	dns01FormErr  = "formerr"
	dns01BadVers  = "badvers" // an EDNS version above 0
	dns01Busy     = "busy"    // SERVFAIL at once: MaxInflight questions wait for a read
	dns01Slipped  = "slipped" // rate-limited, answered empty with TC
	dns01Dropped  = "dropped" // rate-limited, not answered
)

// dns01UDPReaders read the UDP socket: a packet needs microseconds of work unless it
// waits for a read, which a goroutine of its own does.
const dns01UDPReaders = 4

// readUDP answers the questions that come to pc until it is closed.
func (s *DNS01Server) readUDP(pc net.PacketConn) {
	defer s.wg.Done()
	buf := make([]byte, dns.MaxMsgSize)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) || s.ctx.Err() != nil {
				return
			}
			s.log.Debug("DNS-01 UDP read failed", zap.Error(err))
			select {
			case <-time.After(acceptPauseMin):
			case <-s.ctx.Done():
				return
			}
			continue
		}
		s.packet(pc, buf[:n], from)
	}
}

// packet answers one UDP packet, as miekg/dns's server would (responses ignored,
// other opcodes NOTIMP, what does not parse FORMERR), with the rate limit first.
func (s *DNS01Server) packet(pc net.PacketConn, pkt []byte, from net.Addr) {
	arrived := time.Now()
	if len(pkt) < 12 {
		return
	}
	hdr := dns.Header{
		Id: binary.BigEndian.Uint16(pkt), Bits: binary.BigEndian.Uint16(pkt[2:]),
		Qdcount: binary.BigEndian.Uint16(pkt[4:]), Ancount: binary.BigEndian.Uint16(pkt[6:]),
		Nscount: binary.BigEndian.Uint16(pkt[8:]), Arcount: binary.BigEndian.Uint16(pkt[10:]),
	}
	action := dns.DefaultMsgAcceptFunc(hdr)
	if action == dns.MsgIgnore {
		return
	}
	req := new(dns.Msg)
	if action == dns.MsgAccept && req.Unpack(pkt) != nil {
		action = dns.MsgReject
	}
	verdict := s.rrl.verdict(from, arrived)
	switch {
	case verdict == rrlDrop, verdict == rrlSlip && action != dns.MsgAccept:
		s.m.query(dns01Dropped)
		return
	case verdict == rrlSlip:
		m := new(dns.Msg)
		m.SetReply(req)
		m.Truncated = true
		s.m.query(dns01Slipped)
		s.sendUDP(pc, from, m)
		return
	case action != dns.MsgAccept:
		m := &dns.Msg{MsgHdr: dns.MsgHdr{Id: hdr.Id, Response: true, Opcode: int(hdr.Bits>>11) & 0xF, Rcode: dns.RcodeFormatError}}
		if action == dns.MsgRejectNotImplemented {
			m.Rcode = dns.RcodeNotImplemented
		}
		s.m.query(dns01FormErr)
		s.sendUDP(pc, from, m)
		return
	}
	if !s.needsRead(req) {
		s.sendUDP(pc, from, s.reply(req, true))
		return
	}
	if !s.acquire() {
		s.sendUDP(pc, from, s.busy(req, true))
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.release()
		s.sendUDP(pc, from, s.reply(req, true))
	}()
}

func (s *DNS01Server) sendUDP(pc net.PacketConn, to net.Addr, m *dns.Msg) {
	b, err := m.Pack()
	if err != nil {
		s.log.Debug("DNS-01 answer not packed", zap.Error(err))
		return
	}
	_, _ = pc.WriteTo(b, to)
}

// serveTCP answers a question that came over TCP (never rate-limited: the
// handshake proved its source).
func (s *DNS01Server) serveTCP(w dns.ResponseWriter, req *dns.Msg) {
	var m *dns.Msg
	switch {
	case !s.needsRead(req):
		m = s.reply(req, false)
	case s.acquire():
		m = s.reply(req, false)
		s.release()
	default:
		m = s.busy(req, false)
	}
	_ = w.WriteMsg(m)
}

// acquire takes a slot for a question that waits for a read; false when all are
// taken. release gives it back.
func (s *DNS01Server) acquire() bool {
	select {
	case s.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

func (s *DNS01Server) release() { <-s.slots }

// needsRead reports whether answering req may wait for a read of the values table:
// a question at a name that can be a target. answer reads for no other.
func (s *DNS01Server) needsRead(req *dns.Msg) bool {
	if req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 {
		return false
	}
	_, ok := s.targetLabel(strings.ToLower(req.Question[0].Name))
	return ok
}

// targetLabel is the first label of name when name can be a target: one label,
// target-shaped, right under the zone.
func (s *DNS01Server) targetLabel(name string) (string, bool) {
	label, rest, _ := strings.Cut(name, ".")
	if rest != s.zone || !isTargetLabel(label) {
		return "", false
	}
	if _, ok := s.hosts[name]; ok {
		return "", false
	}
	return label, true
}

// reply is the answer to req, sized for its transport.
func (s *DNS01Server) reply(req *dns.Msg, udp bool) *dns.Msg {
	m := new(dns.Msg)
	s.m.query(s.answer(req, m))
	fit(req, m, udp)
	return m
}

// busy is SERVFAIL for a question beyond MaxInflight.
func (s *DNS01Server) busy(req *dns.Msg, udp bool) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(req, dns.RcodeServerFailure)
	m.RecursionAvailable = false
	s.m.query(dns01Busy)
	fit(req, m, udp)
	return m
}

// fit adds the OPT record an EDNS question is answered with, and truncates m to what
// the client can take over UDP (its EDNS buffer, at most dns01UDPSize; 512 bytes
// without EDNS).
func fit(req, m *dns.Msg, udp bool) {
	size := dns.MinMsgSize
	if opt := req.IsEdns0(); opt != nil {
		size = max(min(int(opt.UDPSize()), dns01UDPSize), dns.MinMsgSize)
		if m.IsEdns0() == nil && m.Rcode != dns.RcodeFormatError {
			m.SetEdns0(dns01UDPSize, false)
		}
	}
	if udp {
		m.Truncate(size)
	} else {
		m.Truncate(dns.MaxMsgSize)
	}
}

// answer fills m, the reply to req, and says what it came to.
func (s *DNS01Server) answer(req *dns.Msg, m *dns.Msg) string {
	m.SetReply(req)
	m.RecursionAvailable = false
	m.Compress = true
	if req.Opcode != dns.OpcodeQuery {
		m.SetRcode(req, dns.RcodeRefused)
		return dns01Refused
	}
	if len(req.Question) != 1 {
		m.SetRcode(req, dns.RcodeFormatError)
		return dns01FormErr
	}
	if result, done := ednsCheck(req, m); done {
		return result
	}
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	if !dns.IsSubDomain(s.zone, name) || (q.Qclass != dns.ClassINET && q.Qclass != dns.ClassANY) ||
		q.Qtype == dns.TypeAXFR || q.Qtype == dns.TypeIXFR {
		m.SetRcode(req, dns.RcodeRefused)
		return dns01Refused
	}
	m.Authoritative = true
	if name == s.zone {
		return s.apex(q, m)
	}
	if rrs, ok := s.hosts[name]; ok {
		return s.host(q, rrs, m)
	}
	label, ok := s.targetLabel(name)
	if !ok {
		if s.emptyNonTerminal(name) {
			m.Ns = []dns.RR{s.soa}
			return dns01NoData
		}
		// Deeper names and labels that cannot be a target: nothing to read.
		m.SetRcode(req, dns.RcodeNameError)
		m.Ns = []dns.RR{s.soa}
		return dns01NXDomain
	}
	ctx, cancel := context.WithTimeout(s.ctx, dns01ReadTimeout+s.opts.ReadInterval)
	defer cancel()
	values, ok, err := s.valuesAt(ctx, label)
	if err != nil {
		m.SetRcode(req, dns.RcodeServerFailure)
		m.Authoritative = false
		return dns01ServFail
	}
	if !ok {
		m.SetRcode(req, dns.RcodeNameError)
		m.Ns = []dns.RR{s.soa}
		return dns01NXDomain
	}
	switch q.Qtype {
	case dns.TypeTXT:
		for _, v := range values {
			m.Answer = append(m.Answer, &dns.TXT{
				Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: dns01TXTTTL},
				Txt: []string{v},
			})
		}
	case dns.TypeANY:
		m.Answer = []dns.RR{hinfo(q.Name, dns01TXTTTL)}
	default:
		m.Ns = []dns.RR{s.soa}
		return dns01NoData
	}
	return dns01Answered
}

// ednsCheck answers a question whose EDNS RFC 6891 refuses: two OPT records are
// FORMERR (§6.1.1), a version above 0 BADVERS with an OPT of version 0 (§6.1.3).
func ednsCheck(req, m *dns.Msg) (string, bool) {
	opts := 0
	for _, rr := range req.Extra {
		if rr.Header().Rrtype == dns.TypeOPT {
			opts++
		}
	}
	if opts > 1 {
		m.SetRcode(req, dns.RcodeFormatError)
		return dns01FormErr, true
	}
	if opt := req.IsEdns0(); opt != nil && opt.Version() != 0 {
		m.SetEdns0(dns01UDPSize, false)
		m.Rcode = dns.RcodeBadVers
		return dns01BadVers, true
	}
	return "", false
}

// hinfo is RFC 8482's answer to ANY at a name that exists: one small synthesized
// record instead of every one the name has.
func hinfo(name string, ttl uint32) dns.RR {
	return &dns.HINFO{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeHINFO, Class: dns.ClassINET, Ttl: ttl}, Cpu: "RFC8482"}
}

// apex answers a question at the zone's apex.
func (s *DNS01Server) apex(q dns.Question, m *dns.Msg) string {
	switch q.Qtype {
	case dns.TypeSOA:
		soa := *s.soa
		m.Answer = []dns.RR{&soa}
	case dns.TypeNS:
		for _, n := range s.ns {
			m.Answer = append(m.Answer, &dns.NS{
				Hdr: dns.RR_Header{Name: s.zone, Rrtype: dns.TypeNS, Class: dns.ClassINET, Ttl: dns01ApexTTL}, Ns: n})
			m.Extra = append(m.Extra, s.hosts[n]...)
		}
	case dns.TypeANY:
		m.Answer = []dns.RR{hinfo(q.Name, dns01ApexTTL)}
	default:
		m.Ns = []dns.RR{s.soa}
		return dns01NoData
	}
	return dns01Answered
}

// host answers a question at a name server inside the zone given with its address.
func (s *DNS01Server) host(q dns.Question, rrs []dns.RR, m *dns.Msg) string {
	if q.Qtype == dns.TypeANY {
		m.Answer = []dns.RR{hinfo(q.Name, dns01ApexTTL)}
		return dns01Answered
	}
	for _, rr := range rrs {
		if rr.Header().Rrtype == q.Qtype {
			c := dns.Copy(rr)
			c.Header().Name = q.Name
			m.Answer = append(m.Answer, c)
		}
	}
	if len(m.Answer) == 0 {
		m.Ns = []dns.RR{s.soa}
		return dns01NoData
	}
	return dns01Answered
}

// emptyNonTerminal reports whether name has no records but a name server's name
// under it does: it exists, with no data (RFC 8020).
func (s *DNS01Server) emptyNonTerminal(name string) bool {
	for h := range s.hosts {
		if strings.HasSuffix(h, "."+name) {
			return true
		}
	}
	return false
}

// isTargetLabel reports whether label can be a target's (dns01Label: 32 hex digits),
// so that anything else is answered without waiting for a read.
func isTargetLabel(label string) bool {
	if len(label) != 32 {
		return false
	}
	for i := 0; i < len(label); i++ {
		c := label[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// valuesAt are the values at label, from a read of the values table that begins
// after this call (so after the question arrived): the label joins the next read,
// which starts at once unless one is under way, and never sooner than ReadInterval
// after the last one began. false when the label holds none; an error when the read
// failed or ctx ended first.
func (s *DNS01Server) valuesAt(ctx context.Context, label string) ([]string, bool, error) {
	s.mu.Lock()
	if s.next == nil {
		s.next = &dns01Read{labels: map[string]struct{}{}, done: make(chan struct{})}
	}
	r := s.next
	r.labels[label] = struct{}{}
	if !s.reading {
		s.reading = true
		go s.readLoop()
	}
	s.mu.Unlock()
	select {
	case <-r.done:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	if r.err != nil {
		return nil, false, r.err
	}
	values, ok := r.values[label]
	return values, ok, nil
}

// readLoop runs the reads the questions wait for, one after another, each no sooner
// than ReadInterval after the one before began, until none is waited for.
func (s *DNS01Server) readLoop() {
	for {
		s.mu.Lock()
		wait := time.Until(s.lastRead.Add(s.opts.ReadInterval))
		s.mu.Unlock()
		if wait > 0 {
			time.Sleep(wait) // a read's own pacing; questions wait on their read's done
		}
		s.mu.Lock()
		r := s.next
		s.next = nil
		if r == nil {
			s.reading = false
			s.mu.Unlock()
			return
		}
		s.lastRead = time.Now()
		s.mu.Unlock()
		s.read(r)
	}
}

// read reads the values at r's labels, at most dns01MaxValues each, and closes
// r.done. It reads by target, through the table's index on it, so that it costs the
// same whatever else the table holds.
func (s *DNS01Server) read(r *dns01Read) {
	defer close(r.done)
	s.reads.Add(1)
	s.m.reads.Inc()
	labels := make([]string, 0, len(r.labels))
	for l := range r.labels {
		labels = append(labels, l)
	}
	r.values = map[string][]string{}
	ctx, cancel := context.WithTimeout(s.ctx, dns01ReadTimeout)
	defer cancel()
	rows, err := s.pool.Query(ctx, `
SELECT t.target, v.value
FROM unnest($1::text[]) AS t(target)
CROSS JOIN LATERAL (
    SELECT value FROM certworker_dns01_values
    WHERE target = t.target AND expires_at > now()
    ORDER BY token LIMIT $2
) v`, labels, dns01MaxValues)
	if err == nil {
		var target, value string
		_, err = pgx.ForEachRow(rows, []any{&target, &value}, func() error {
			r.values[target] = append(r.values[target], value)
			return nil
		})
	}
	if err != nil {
		s.log.Warn("DNS-01 values could not be read; answering SERVFAIL", zap.Error(err))
		r.err = err
	}
}

// dns01Metrics are the server's Prometheus metrics; unregistered ones still count.
type dns01Metrics struct {
	queries *prometheus.CounterVec
	reads   prometheus.Counter
}

func newDNS01Metrics(reg prometheus.Registerer) dns01Metrics {
	m := dns01Metrics{
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "certworker_dns01_queries_total",
			Help: "DNS-01 zone queries by result: answered, nodata, nxdomain, refused (outside the zone, or a zone transfer), servfail (the database could not be read), formerr, badvers (an EDNS version above 0), busy (SERVFAIL at once: too many questions waiting for a read), slipped and dropped (UDP rate limit: answered empty with TC, or not at all).",
		}, []string{"result"}),
		reads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "certworker_dns01_reads_total",
			Help: "Reads of the DNS-01 values table; at most one per read interval (50 ms) whatever the queries.",
		}),
	}
	for _, r := range []string{dns01Answered, dns01NoData, dns01NXDomain, dns01Refused, dns01ServFail, dns01FormErr,
		dns01BadVers, dns01Busy, dns01Slipped, dns01Dropped} {
		m.queries.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.queries, m.reads)
	}
	return m
}

func (m dns01Metrics) query(r string) { m.queries.WithLabelValues(r).Inc() }
