package acme

import (
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Response-rate limiting of the DNS-01 zone's UDP answers. A UDP question's source
// can be forged, so without a limit anyone can have the zone send its answers to a
// victim. The limit is per source prefix, as BIND's, Knot's and NSD's are: a /24 of
// IPv4 or a /56 of IPv6 (what one site holds, so that a forger cannot dodge it by
// varying the last bits), a token bucket of Rate answers a second and as many at
// once. Past it, one answer in Slip goes out empty with TC set, as small as the
// question, and the others are dropped: a real resolver, which the forger cannot
// be, asks again over TCP, which is never limited (its handshake proves the
// source). TCP and the exempt prefixes are never limited.
const (
	rrlPrefixV4 = 24
	rrlPrefixV6 = 56

	// DefaultDNS01RateLimit is --dns01-rate-limit's default: answers a second to
	// one source prefix. A resolver asks the zone a handful of questions a
	// validation (the CA's validations come from several places, each its own
	// resolver); 20 a second is Knot's default, and what a busy resolver asks
	// beyond it is answered over TCP.
	DefaultDNS01RateLimit = 20
	// DefaultDNS01RateLimitSlip is --dns01-rate-limit-slip's default: every
	// second limited answer goes out truncated (BIND's and Knot's default).
	DefaultDNS01RateLimitSlip = 2

	// rrlMaxPrefixes bounds the prefixes tracked, about 200 bytes each: past it,
	// the ones whose bucket is full again (silent for a second) are forgotten,
	// and while none is, new prefixes share one bucket.
	rrlMaxPrefixes = 1 << 16
)

// rrlVerdict is what the limiter says of an answer.
type rrlVerdict int

const (
	rrlAnswer rrlVerdict = iota // send it
	rrlSlip                     // send it empty, truncated
	rrlDrop                     // send nothing
)

// rateLimiter limits UDP answers per source prefix. Safe for concurrent use.
type rateLimiter struct {
	rate   rate.Limit
	burst  int
	slip   int
	exempt []netip.Prefix

	mu       sync.Mutex
	prefixes map[netip.Prefix]*rrlBucket // guarded by mu
	overflow *rrlBucket                  // guarded by mu
	clock    steadyClock                 // guarded by mu
}

type rrlBucket struct {
	lim     *rate.Limiter
	limited int // answers limited so far, for the slip
}

// newRateLimiter limits to perSecond answers a second a prefix (nil, no limit, when
// it is 0 or less), sending one limited answer in slip truncated (none when slip is 0).
func newRateLimiter(perSecond, slip int, exempt []netip.Prefix) *rateLimiter {
	if perSecond <= 0 {
		return nil
	}
	return &rateLimiter{
		rate: rate.Limit(perSecond), burst: perSecond, slip: max(slip, 0), exempt: exempt,
		prefixes: map[netip.Prefix]*rrlBucket{},
		overflow: &rrlBucket{lim: rate.NewLimiter(rate.Limit(perSecond), perSecond)},
	}
}

// verdict takes a token of from's prefix at now, and says what to do with the answer.
func (l *rateLimiter) verdict(from net.Addr, now time.Time) rrlVerdict {
	if l == nil {
		return rrlAnswer
	}
	ap, ok := addrOf(from)
	if !ok {
		return rrlAnswer
	}
	for _, p := range l.exempt {
		if p.Contains(ap) {
			return rrlAnswer
		}
	}
	bits := rrlPrefixV6
	if ap.Is4() {
		bits = rrlPrefixV4
	}
	key, _ := ap.Prefix(bits)
	l.mu.Lock()
	defer l.mu.Unlock()
	now = l.clock.at(now)
	b := l.bucketLocked(key, now)
	if b.lim.AllowN(now, 1) {
		return rrlAnswer
	}
	b.limited++
	if l.slip > 0 && b.limited%l.slip == 0 {
		return rrlSlip
	}
	return rrlDrop
}

// bucketLocked is key's bucket, made if need be; called with mu held.
func (l *rateLimiter) bucketLocked(key netip.Prefix, now time.Time) *rrlBucket {
	if b, ok := l.prefixes[key]; ok {
		return b
	}
	if len(l.prefixes) >= rrlMaxPrefixes {
		for k, b := range l.prefixes {
			if b.lim.TokensAt(now) >= float64(l.burst) {
				delete(l.prefixes, k)
			}
		}
		if len(l.prefixes) >= rrlMaxPrefixes {
			return l.overflow
		}
	}
	b := &rrlBucket{lim: rate.NewLimiter(l.rate, l.burst)}
	l.prefixes[key] = b
	return b
}

// addrOf is the IP address of a UDP or TCP peer, IPv4-mapped ones as IPv4.
func addrOf(a net.Addr) (netip.Addr, bool) {
	var ip net.IP
	switch a := a.(type) {
	case *net.UDPAddr:
		ip = a.IP
	case *net.TCPAddr:
		ip = a.IP
	default:
		return netip.Addr{}, false
	}
	ap, ok := netip.AddrFromSlice(ip)
	return ap.Unmap(), ok
}

// ParseDNS01RateLimitExempt reads --dns01-rate-limit-exempt: comma-separated CIDR
// ranges whose questions are never rate-limited.
func ParseDNS01RateLimitExempt(s string) ([]netip.Prefix, error) {
	return parsePrefixes("--dns01-rate-limit-exempt", s)
}

// steadyClock hands a rate.Limiter times that never go back, under the lock that
// orders the limiter's calls. The limiter adds the time since its last call to its
// bucket, and takes a time earlier than that call's as given, so it counts the time
// between them again (golang.org/x/time/rate: advance, then last = t). A caller that
// read the clock before another but reached the limiter after it (descheduled in
// between, as on a busy machine) would so let more through than the rate: the HTTP-01
// responder's look-ups went one over their 50 a second beside a CPU hog.
type steadyClock struct{ latest time.Time }

// at is t, or the latest time handed out when t is before it.
func (c *steadyClock) at(t time.Time) time.Time {
	if t.Before(c.latest) {
		return c.latest
	}
	c.latest = t
	return t
}
