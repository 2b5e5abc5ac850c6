package acme

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/miekg/dns"
)

var _ issuing.DNSChecker = (*Issuer)(nil)

// CheckDNS is issuing.DNSChecker: whether a domain waiting for its DNS can be validated
// now, by the same checks an order's preflight makes, sending nothing to the CA. The
// HTTP probe runs only when the DNS answer differs from answer (the fingerprint the
// last check saw), or when --dns-target is given and the answer matches it; while
// the answer is unchanged the result is a *issuing.WaitingError with no message (what
// the tenant reads stays as it is).
func (i *Issuer) CheckDNS(ctx context.Context, domain, answer string) error {
	choice, err := i.choose(ctx, domain)
	if err != nil {
		return i.waiting(ctx, domain, err)
	}
	if choice.challenge == issuing.ChallengeDNS01 || i.preflight == nil {
		return nil
	}
	seen := i.dnsAnswer(ctx, domain)
	if seen == answer && answer != "" {
		return &issuing.WaitingError{Answer: seen}
	}
	if msg, ok := i.offTarget(ctx, domain); ok {
		return &issuing.WaitingError{Msg: i.waitMessage(domain, msg), Answer: seen}
	}
	if err := i.preflight.check(ctx, domain); err != nil {
		return i.waiting(ctx, domain, err)
	}
	return nil
}

// waiting turns a preflight's verdict on a name into a *issuing.WaitingError (with
// --preflight http; with it off, the CA decides, and the error stays as it is). Other
// errors are returned unchanged.
func (i *Issuer) waiting(ctx context.Context, domain string, err error) error {
	var pe *issuing.PreflightError
	if i.preflight == nil || !errors.As(err, &pe) {
		return err
	}
	return &issuing.WaitingError{Msg: i.waitMessage(domain, pe.Msg), Answer: i.dnsAnswer(ctx, domain), Seen: pe}
}

// waitMessage is what a waiting domain's ssl_error says after its prefix: what was
// seen, then what to set.
func (i *Issuer) waitMessage(domain, seen string) string {
	base := strings.TrimPrefix(domain, "*.")
	var set []string
	if !isWildcard(domain) {
		to := "this proxy's addresses"
		if t, _ := ParseDNSTarget(i.cfg.DNSTarget); t.Host != "" {
			to = t.Host + " (CNAME)"
		} else if len(t.Addrs) > 0 {
			to = t.String()
		}
		set = append(set, "point "+base+" at "+to)
	}
	if i.cfg.DNS01Zone != "" {
		set = append(set, "set "+challengeName(domain)+" CNAME "+DNS01Target(i.cfg.DNS01Zone, domain))
	}
	return seen + "; to be issued, " + strings.Join(set, ", or ")
}

// offTarget reports, with --dns-target, a name whose answers do not match it (the
// name is not pointed at the proxy yet, and no probe is worth making), and what was
// seen.
func (i *Issuer) offTarget(ctx context.Context, domain string) (string, bool) {
	t, _ := ParseDNSTarget(i.cfg.DNSTarget)
	if t.Host == "" && len(t.Addrs) == 0 {
		return "", false
	}
	if t.Host != "" {
		if cn, err := i.dns.cname(ctx, domain); err == nil && cn == t.Host {
			return "", false
		}
	}
	addrs, err := i.addresses(ctx, domain)
	if err != nil {
		return "", false // the probe decides
	}
	want := t.Addrs
	if t.Host != "" {
		if want, err = i.addresses(ctx, t.Host); err != nil {
			return "", false
		}
	}
	for _, a := range addrs {
		if slices.Contains(want, a) {
			return "", false
		}
	}
	if len(addrs) == 0 {
		return fmt.Sprintf("no such name: %s does not resolve to an address", domain), true
	}
	shown := make([]string, len(addrs))
	for n, a := range addrs {
		shown[n] = a.String()
	}
	return fmt.Sprintf("%s resolves to %s, not to %s", domain, strings.Join(shown, ", "), t), true
}

// addresses are the A and AAAA answers for name, sorted.
func (i *Issuer) addresses(ctx context.Context, name string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, qtype := range []uint16{dns.TypeA, dns.TypeAAAA} {
		in, err := i.dns.exchange(ctx, name, qtype)
		if err != nil {
			return nil, err
		}
		for _, rr := range in.Answer {
			switch r := rr.(type) {
			case *dns.A:
				if a, ok := netip.AddrFromSlice(r.A); ok {
					out = append(out, a.Unmap())
				}
			case *dns.AAAA:
				if a, ok := netip.AddrFromSlice(r.AAAA); ok {
					out = append(out, a)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return slices.Compact(out), nil
}

// maxDNSAnswer bounds the fingerprint dnsAnswer gives, which is stored with each
// waiting domain: a tenant's DNS may answer thousands of addresses.
const maxDNSAnswer = 1024

// dnsAnswer is a fingerprint of what the DNS says of domain: its addresses and its
// _acme-challenge CNAME, as text, or a SHA-256 of that text when it is longer than
// maxDNSAnswer. "" when the resolver did not answer (no fingerprint: the next check
// probes).
func (i *Issuer) dnsAnswer(ctx context.Context, domain string) string {
	answer := i.dnsAnswerText(ctx, domain)
	if len(answer) > maxDNSAnswer {
		sum := sha256.Sum256([]byte(answer))
		return "sha256:" + hex.EncodeToString(sum[:])
	}
	return answer
}

// dnsAnswerText is dnsAnswer's text, unbounded.
func (i *Issuer) dnsAnswerText(ctx context.Context, domain string) string {
	var parts []string
	if !isWildcard(domain) {
		addrs, err := i.addresses(ctx, domain)
		if err != nil {
			return ""
		}
		for _, a := range addrs {
			parts = append(parts, a.String())
		}
	}
	if i.cfg.DNS01Zone != "" {
		cn, err := i.dns.cname(ctx, challengeName(domain))
		if err != nil {
			return ""
		}
		parts = append(parts, "cname="+cn)
	}
	return strings.Join(parts, " ")
}
