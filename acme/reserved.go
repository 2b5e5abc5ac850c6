package acme

import (
	"fmt"
	"net/netip"
	"strings"
)

// reservedV4 are the IPv4 blocks the preflight never connects to: those of IANA's
// IPv4 Special-Purpose Address Registry that are not globally reachable, and
// multicast and the class E space beside them. A tenant's DNS can point its name at
// any of them, and the preflight runs inside the operator's network: loopback reaches
// the worker's own admin port, link-local the cloud's metadata service
// (169.254.169.254), private and shared space the operator's other services. A public
// CA refuses to validate at these addresses anyway, so a name that resolves to one
// would fail at the CA too.
var reservedV4 = prefixes(
	"0.0.0.0/8",       // "this network" (RFC 791); 0.0.0.0 reaches the local host
	"10.0.0.0/8",      // private (RFC 1918)
	"100.64.0.0/10",   // shared address space, carrier-grade NAT (RFC 6598)
	"127.0.0.0/8",     // loopback (RFC 1122)
	"169.254.0.0/16",  // link-local (RFC 3927), cloud metadata services
	"172.16.0.0/12",   // private (RFC 1918)
	"192.0.0.0/24",    // IETF protocol assignments (RFC 6890)
	"192.0.2.0/24",    // documentation, TEST-NET-1 (RFC 5737)
	"192.88.99.0/24",  // the deprecated 6to4 relay anycast (RFC 7526)
	"192.168.0.0/16",  // private (RFC 1918)
	"198.18.0.0/15",   // benchmarking (RFC 2544)
	"198.51.100.0/24", // documentation, TEST-NET-2 (RFC 5737)
	"203.0.113.0/24",  // documentation, TEST-NET-3 (RFC 5737)
	"224.0.0.0/4",     // multicast (RFC 5771)
	"240.0.0.0/4",     // reserved (RFC 1112), with the limited broadcast 255.255.255.255
)

// globalUnicastV6 is the only IPv6 space IANA allocates for global unicast (RFC 4291
// §2.4, IANA's IPv6 Address Space registry). Everything outside it is reserved here:
// the unspecified address and loopback, IPv4-compatible and -mapped forms (a mapped
// address is checked as the IPv4 address it is), NAT64's 64:ff9b::/96 and
// 64:ff9b:1::/48 (RFC 6052, RFC 8215: they reach IPv4 space through a translator,
// private space included), discard-only 100::/64, the 5f00::/16 SRv6 SIDs, unique
// local fc00::/7, link-local fe80::/10 and multicast ff00::/8.
var globalUnicastV6 = netip.MustParsePrefix("2000::/3")

// reservedV6 are the blocks inside global unicast that IANA's IPv6 Special-Purpose
// Address Registry marks as not globally reachable, or that reach IPv4 space through
// a relay.
var reservedV6 = prefixes(
	"2001::/23",     // IETF protocol assignments (RFC 2928), TEREDO 2001::/32 among them
	"2001:db8::/32", // documentation (RFC 3849)
	"2002::/16",     // 6to4 (RFC 3056): an IPv4 address behind a relay
	"3fff::/20",     // documentation (RFC 9637)
)

func prefixes(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(s))
	for i, p := range s {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

// isReserved reports whether addr is an address the preflight must not connect to,
// unless allow holds it. An IPv4-mapped IPv6 address (::ffff:a.b.c.d) is judged as the
// IPv4 address it reaches.
func isReserved(addr netip.Addr, allow []netip.Prefix) bool {
	addr = addr.Unmap().WithZone("")
	for _, p := range allow {
		if p.Contains(addr) {
			return false
		}
	}
	if addr.Is4() {
		for _, p := range reservedV4 {
			if p.Contains(addr) {
				return true
			}
		}
		return false
	}
	if !addr.IsValid() || !globalUnicastV6.Contains(addr) {
		return true
	}
	for _, p := range reservedV6 {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// ParseAllowCIDR reads --preflight-allow-cidr: comma-separated CIDR ranges (spaces
// around each are ignored) the preflight may connect to although they are reserved,
// for tests and for a private CA that validates inside the operator's network. ""
// allows none. An IPv4 range also covers the IPv4-mapped IPv6 form of its addresses.
func ParseAllowCIDR(s string) ([]netip.Prefix, error) {
	return parsePrefixes("--preflight-allow-cidr", s)
}

// parsePrefixes reads flag's comma-separated CIDR ranges, as ParseAllowCIDR says.
func parsePrefixes(flag, s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		p, err := netip.ParsePrefix(part)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not a CIDR range (such as 10.0.0.0/8 or fd00::/8)", flag, part)
		}
		if p.Addr().Zone() != "" {
			return nil, fmt.Errorf("%s: %q: a range has no zone", flag, part)
		}
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			// Addresses are judged unmapped: ::ffff:10.0.0.0/104 is 10.0.0.0/8.
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
