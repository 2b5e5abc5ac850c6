package acme

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
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

// The zone's answers (CONTRACT §4). A resolver caches what it is told: the TXT of an
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
	// asked is always seen; a query waits at most this long plus the read for it.
	DefaultDNS01ReadInterval = 50 * time.Millisecond

	// dns01ReadTimeout bounds a read; past it the database counts as unreachable
	// (SERVFAIL), and the CA's resolver asks again.
	dns01ReadTimeout = 3 * time.Second

	// dns01MaxLoaded bounds the rows one read takes: orders in flight are at most a
	// few hundred; the bound only keeps a table filled by mistake from filling the
	// memory.
	dns01MaxLoaded = 10000

	// dns01TCPTimeout bounds a TCP client's silence: a resolver asks and goes.
	dns01TCPTimeout = 5 * time.Second

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
	// Zone is --dns01-zone; Nameservers are --dns01-nameservers (host names).
	Zone        string
	Nameservers []string
	// ReadInterval is the shortest gap between two reads of the values table; 0 is
	// DefaultDNS01ReadInterval.
	ReadInterval time.Duration
	// Registerer, if not nil, receives certworker_dns01_queries_total{rcode} and
	// certworker_dns01_reads_total.
	Registerer prometheus.Registerer
}

// DNS01Server answers --dns01-zone authoritatively (CONTRACT §4) over UDP and TCP,
// from certworker_dns01_values, on every instance alike: a value written by one
// instance's order is answered by all.
//
//   - SOA and NS at the apex; the apex holds no other data (NOERROR, no answer);
//   - TXT at a target holds its values, read from the database (a target has no
//     other type: NOERROR, no answer); a name the zone does not hold is NXDOMAIN, with
//     the SOA, whose minimum (5 s) is the negative TTL;
//   - a name outside the zone, another class or another opcode is REFUSED: it never
//     recurses, so it is no open resolver;
//   - answers are bounded (dns01MaxValues) and a UDP answer larger than the client's
//     buffer is truncated, so it amplifies nothing;
//   - SERVFAIL while the database cannot be read, never its error.
//
// The database is read as a whole snapshot of the values in flight (they are few),
// at most once per ReadInterval whatever the queries, and every answer below the
// apex comes from a read that began after its query arrived: a flood of random labels
// costs the database at most 1/ReadInterval reads a second, and no value committed
// before the CA asked is missed.
//
// It has its own dns.ServeMux: miekg/dns's default mux is process-wide (challtestsrv
// registers on it).
type DNS01Server struct {
	pool *pgxpool.Pool
	log  *zap.Logger
	zone string // fully qualified, lower case
	ns   []string
	soa  *dns.SOA
	opts DNS01Options
	mux  *dns.ServeMux
	m    dns01Metrics

	reads atomic.Int64

	mu sync.Mutex
	// snap is the last read; loading is the read under way, closed when it ends.
	// Guarded by mu.
	snap     *dns01Snapshot
	loading  chan struct{}
	lastRead time.Time

	runMu   sync.Mutex
	servers []*dns.Server // guarded by runMu
}

// dns01Snapshot is one read of the values table.
type dns01Snapshot struct {
	started time.Time
	values  map[string][]string // by target label
	err     error
}

// NewDNS01Server returns a server for opts.Zone reading pool's database. It does not
// listen: Serve does.
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
	if len(opts.Nameservers) == 0 {
		return nil, errors.New("--dns01-nameservers: required with --dns01-zone")
	}
	var ns []string
	for _, n := range opts.Nameservers {
		n = strings.TrimSpace(n)
		if _, ok := dns.IsDomainName(n); !ok || n == "" || net.ParseIP(n) != nil {
			return nil, fmt.Errorf("--dns01-nameservers: %q is not a host name", n)
		}
		ns = append(ns, dns.Fqdn(strings.ToLower(n)))
	}
	if opts.ReadInterval <= 0 {
		opts.ReadInterval = DefaultDNS01ReadInterval
	}
	s := &DNS01Server{
		pool: pool, log: log.Named("dns01"), zone: zone, ns: ns, opts: opts,
		mux: dns.NewServeMux(), m: newDNS01Metrics(opts.Registerer),
	}
	s.soa = &dns.SOA{
		Hdr: dns.RR_Header{Name: zone, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: dns01NegTTL},
		Ns:  ns[0], Mbox: "hostmaster." + zone, Serial: dns01SOASerial,
		Refresh: 3600, Retry: 600, Expire: 86400, Minttl: dns01NegTTL,
	}
	// Every name comes to one handler, which refuses what is outside the zone.
	s.mux.HandleFunc(".", s.serveDNS)
	return s, nil
}

// Zone is the zone served, fully qualified.
func (s *DNS01Server) Zone() string { return s.zone }

// Reads is how many times the server has read the values table.
func (s *DNS01Server) Reads() int64 { return s.reads.Load() }

// Handler is the server's own mux, for a listener the caller runs.
func (s *DNS01Server) Handler() dns.Handler { return s.mux }

// Serve answers on pc (UDP) and ln (TCP), either of which may be nil, until
// Shutdown. It returns once both servers are listening.
func (s *DNS01Server) Serve(pc net.PacketConn, ln net.Listener) error {
	s.runMu.Lock()
	defer s.runMu.Unlock()
	var started []chan struct{}
	start := func(srv *dns.Server) {
		ch := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(ch) }
		started = append(started, ch)
		s.servers = append(s.servers, srv)
		go func() {
			if err := srv.ActivateAndServe(); err != nil {
				s.log.Warn("DNS-01 listener stopped", zap.String("net", srv.Net), zap.Error(err))
			}
		}()
	}
	if pc != nil {
		start(&dns.Server{PacketConn: pc, Net: "udp", Handler: s.mux, ReadTimeout: dns01TCPTimeout, WriteTimeout: dns01TCPTimeout})
	}
	if ln != nil {
		start(&dns.Server{Listener: ln, Net: "tcp", Handler: s.mux,
			ReadTimeout: dns01TCPTimeout, WriteTimeout: dns01TCPTimeout,
			IdleTimeout: func() time.Duration { return dns01TCPTimeout }, MaxTCPQueries: 16})
	}
	for _, ch := range started {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			return errors.New("DNS-01 listener did not start")
		}
	}
	return nil
}

// Shutdown stops the listeners. Safe before Serve and twice.
func (s *DNS01Server) Shutdown() {
	s.runMu.Lock()
	defer s.runMu.Unlock()
	for _, srv := range s.servers {
		_ = srv.Shutdown()
	}
	s.servers = nil
}

// What a query came to, the label of certworker_dns01_queries_total.
const (
	dns01Answered = "answered" // data from the zone
	dns01NoData   = "nodata"   // the name exists, not the type
	dns01NXDomain = "nxdomain"
	dns01Refused  = "refused" // outside the zone, another class or opcode
	dns01ServFail = "servfail"
	dns01FormErr  = "formerr"
)

func (s *DNS01Server) serveDNS(w dns.ResponseWriter, req *dns.Msg) {
	arrived := time.Now()
	m := new(dns.Msg)
	result := s.answer(arrived, req, m)
	s.m.query(result)
	size := dns.MinMsgSize
	if opt := req.IsEdns0(); opt != nil {
		size = max(min(int(opt.UDPSize()), dns01UDPSize), dns.MinMsgSize)
		m.SetEdns0(dns01UDPSize, false)
	}
	if w.LocalAddr().Network() == "udp" {
		m.Truncate(size)
	} else {
		m.Truncate(dns.MaxMsgSize)
	}
	_ = w.WriteMsg(m)
}

// answer fills m, the reply to req, and says what it came to.
func (s *DNS01Server) answer(arrived time.Time, req *dns.Msg, m *dns.Msg) string {
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
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	if !dns.IsSubDomain(s.zone, name) || (q.Qclass != dns.ClassINET && q.Qclass != dns.ClassANY) {
		m.SetRcode(req, dns.RcodeRefused)
		return dns01Refused
	}
	m.Authoritative = true
	if name == s.zone {
		return s.apex(q.Qtype, m)
	}
	label, rest, _ := strings.Cut(name, ".")
	if rest != s.zone || !isTargetLabel(label) {
		// Deeper names and labels that cannot be a target: nothing to read.
		m.SetRcode(req, dns.RcodeNameError)
		m.Ns = []dns.RR{s.soa}
		return dns01NXDomain
	}
	ctx, cancel := context.WithTimeout(context.Background(), dns01ReadTimeout+s.opts.ReadInterval)
	defer cancel()
	snap := s.fresh(ctx, arrived)
	if snap == nil || snap.err != nil {
		m.SetRcode(req, dns.RcodeServerFailure)
		m.Authoritative = false
		return dns01ServFail
	}
	values, ok := snap.values[label]
	if !ok {
		m.SetRcode(req, dns.RcodeNameError)
		m.Ns = []dns.RR{s.soa}
		return dns01NXDomain
	}
	if q.Qtype != dns.TypeTXT && q.Qtype != dns.TypeANY {
		m.Ns = []dns.RR{s.soa}
		return dns01NoData
	}
	for _, v := range values {
		m.Answer = append(m.Answer, &dns.TXT{
			Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: dns01TXTTTL},
			Txt: []string{v},
		})
	}
	return dns01Answered
}

// apex answers a question at the zone's apex.
func (s *DNS01Server) apex(qtype uint16, m *dns.Msg) string {
	switch qtype {
	case dns.TypeSOA:
		soa := *s.soa
		m.Answer = []dns.RR{&soa}
	case dns.TypeNS, dns.TypeANY:
		for _, n := range s.ns {
			m.Answer = append(m.Answer, &dns.NS{
				Hdr: dns.RR_Header{Name: s.zone, Rrtype: dns.TypeNS, Class: dns.ClassINET, Ttl: dns01ApexTTL}, Ns: n})
		}
		if qtype == dns.TypeANY {
			soa := *s.soa
			m.Answer = append(m.Answer, &soa)
		}
	default:
		m.Ns = []dns.RR{s.soa}
		return dns01NoData
	}
	return dns01Answered
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

// fresh returns a read of the values table that began after arrived, starting one
// when none is under way, but never sooner than ReadInterval after the last one
// began. nil when ctx ends first.
func (s *DNS01Server) fresh(ctx context.Context, arrived time.Time) *dns01Snapshot {
	s.mu.Lock()
	for {
		if s.snap != nil && !s.snap.started.Before(arrived) {
			snap := s.snap
			s.mu.Unlock()
			return snap
		}
		if s.loading == nil {
			s.loading = make(chan struct{})
			go s.read(s.loading)
		}
		loading := s.loading
		s.mu.Unlock()
		select {
		case <-loading:
		case <-ctx.Done():
			return nil
		}
		s.mu.Lock()
	}
}

// read reads the values table once, no sooner than ReadInterval after the last read
// began, publishes the snapshot and closes done.
func (s *DNS01Server) read(done chan struct{}) {
	s.mu.Lock()
	wait := time.Until(s.lastRead.Add(s.opts.ReadInterval))
	s.mu.Unlock()
	if wait > 0 {
		time.Sleep(wait) // a read's own pacing; queries wait on done, not on this
	}
	started := time.Now()
	snap := &dns01Snapshot{started: started, values: map[string][]string{}}
	s.reads.Add(1)
	s.m.reads.Inc()
	ctx, cancel := context.WithTimeout(context.Background(), dns01ReadTimeout)
	defer cancel()
	rows, err := s.pool.Query(ctx, `
SELECT target, value FROM certworker_dns01_values
WHERE expires_at > now() ORDER BY target, token LIMIT $1`, dns01MaxLoaded)
	if err == nil {
		var target, value string
		_, err = pgx.ForEachRow(rows, []any{&target, &value}, func() error {
			if len(snap.values[target]) < dns01MaxValues {
				snap.values[target] = append(snap.values[target], value)
			}
			return nil
		})
	}
	if err != nil {
		s.log.Warn("DNS-01 values could not be read; answering SERVFAIL", zap.Error(err))
		snap.err = err
	}
	s.mu.Lock()
	s.snap, s.loading, s.lastRead = snap, nil, started
	s.mu.Unlock()
	close(done)
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
			Help: "DNS-01 zone queries by result: answered, nodata, nxdomain, refused (outside the zone), servfail (the database could not be read), formerr.",
		}, []string{"result"}),
		reads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "certworker_dns01_reads_total",
			Help: "Reads of the DNS-01 values table; at most one per read interval (50 ms) whatever the queries.",
		}),
	}
	for _, r := range []string{dns01Answered, dns01NoData, dns01NXDomain, dns01Refused, dns01ServFail, dns01FormErr} {
		m.queries.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.queries, m.reads)
	}
	return m
}

func (m dns01Metrics) query(r string) { m.queries.WithLabelValues(r).Inc() }
