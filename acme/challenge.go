package acme

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/go-acme/lego/v4/challenge"
	"github.com/miekg/dns"
	"go.uber.org/zap"
)

// challengeChoice is the challenge an order answers, and why (for `status DOMAIN`).
type challengeChoice struct {
	challenge string // issuing.ChallengeHTTP01 or issuing.ChallengeDNS01
	reason    string
}

// legoType is lego's name of the challenge.
func (c challengeChoice) legoType() challenge.Type {
	if c.challenge == issuing.ChallengeDNS01 {
		return challenge.DNS01
	}
	return challenge.HTTP01
}

// dnsClient asks one DNS server (--preflight-resolver, or the system's first) the
// questions of the challenge's choice and of the DNS-01 preflight. An order's own,
// never lego's dns01 package, whose resolvers and CNAME following are process-wide.
type dnsClient struct {
	server  string
	timeout time.Duration
}

// newDNSClient is the client for --preflight-resolver ("" for the system's).
func newDNSClient(server string) *dnsClient {
	if server == "" {
		server = "127.0.0.1:53"
		if cfg, err := dns.ClientConfigFromFile("/etc/resolv.conf"); err == nil && len(cfg.Servers) > 0 {
			server = net.JoinHostPort(cfg.Servers[0], cfg.Port)
		}
	}
	return &dnsClient{server: server, timeout: dnsTimeout}
}

// exchange asks name's qtype, over UDP and again over TCP when the answer was
// truncated. errResolverSilent when the server does not answer in time.
func (c *dnsClient) exchange(ctx context.Context, name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.SetEdns0(dns01UDPSize, false)
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	// Timeout set: without it miekg/dns reads for its own 2 s default, whatever
	// the context allows.
	in, _, err := (&dns.Client{Net: "udp", Timeout: c.timeout}).ExchangeContext(ctx, m, c.server)
	if err == nil && in.Truncated {
		in, _, err = (&dns.Client{Net: "tcp", Timeout: c.timeout}).ExchangeContext(ctx, m, c.server)
	}
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() || ctx.Err() != nil {
			return nil, fmt.Errorf("%w: %s", errResolverSilent, name)
		}
		return nil, fmt.Errorf("ask %s: %w", name, err)
	}
	return in, nil
}

// cname is the target of name's CNAME, lower case and without the trailing dot, or ""
// when it has none.
func (c *dnsClient) cname(ctx context.Context, name string) (string, error) {
	in, err := c.exchange(ctx, name, dns.TypeCNAME)
	if err != nil {
		return "", err
	}
	for _, rr := range in.Answer {
		if cn, ok := rr.(*dns.CNAME); ok && strings.EqualFold(cn.Hdr.Name, dns.Fqdn(name)) {
			return strings.ToLower(strings.TrimSuffix(cn.Target, ".")), nil
		}
	}
	return "", nil
}

// txt are the TXT values answered for name (through any CNAME the resolver follows)
// and, for an answer without any, how long the resolver may keep it as a negative
// answer (RFC 2308 §5: the least of its SOA's TTL and minimum; 0 without an SOA).
func (c *dnsClient) txt(ctx context.Context, name string) ([]string, time.Duration, error) {
	in, err := c.exchange(ctx, name, dns.TypeTXT)
	if err != nil {
		return nil, 0, err
	}
	var out []string
	for _, rr := range in.Answer {
		if t, ok := rr.(*dns.TXT); ok {
			out = append(out, strings.Join(t.Txt, ""))
		}
	}
	var negative time.Duration
	for _, rr := range in.Ns {
		if soa, ok := rr.(*dns.SOA); ok && len(out) == 0 {
			negative = time.Duration(min(soa.Hdr.Ttl, soa.Minttl)) * time.Second
		}
	}
	return out, negative, nil
}

// challengeName is where the CA looks for a name's DNS-01 value: _acme-challenge
// under the name, or under the base of a wildcard (RFC 8555 §8.4).
func challengeName(domain string) string {
	return "_acme-challenge." + strings.TrimPrefix(domain, "*.")
}

// isWildcard reports whether domain is a wildcard (*.BASE).
func isWildcard(domain string) bool { return strings.HasPrefix(domain, "*.") }

// choose picks the challenge for domain (docs/cas.md, DNS-01 by delegation): DNS-01
// when its _acme-challenge CNAME points at its target under --dns01-zone, HTTP-01
// otherwise.
// A wildcard has only DNS-01: without the CNAME it cannot be validated yet, a
// *issuing.PreflightError saying what to set. With the preflight on, DNS-01 is chosen
// only once a probe value written to the zone is seen through the resolver by the
// tenant's name. A resolver that does not answer leaves the choice to what the CA
// will see: HTTP-01, or DNS-01 for a wildcard.
func (i *Issuer) choose(ctx context.Context, domain string) (challengeChoice, error) {
	http01 := challengeChoice{challenge: issuing.ChallengeHTTP01}
	if i.cfg.DNS01Zone == "" {
		http01.reason = "DNS-01 is off"
		return http01, nil
	}
	at, target := challengeName(domain), DNS01Target(i.cfg.DNS01Zone, domain)
	got, err := i.dns.cname(ctx, at)
	if err != nil {
		if ctx.Err() != nil {
			return http01, fmt.Errorf("acme: read the CNAME at %s: %w", at, context.Cause(ctx))
		}
		i.log.Warn("could not read the DNS-01 CNAME; the CA decides",
			issuing.LogDomainCtx(ctx, domain), zap.String("error", err.Error()))
		if isWildcard(domain) {
			return challengeChoice{issuing.ChallengeDNS01, "the resolver did not answer for " + at + "; a wildcard has only DNS-01"}, nil
		}
		http01.reason = "the resolver did not answer for " + at
		return http01, nil
	}
	switch {
	case got == target:
		if i.preflight != nil {
			if err := i.probeDNS01(ctx, domain, at, target); err != nil {
				return challengeChoice{}, err
			}
		}
		return challengeChoice{issuing.ChallengeDNS01, at + " is a CNAME to " + target}, nil
	case isWildcard(domain) && got != "":
		return challengeChoice{}, &issuing.PreflightError{Msg: fmt.Sprintf(
			"a wildcard is validated over DNS-01 only: %s is a CNAME to %s; set it to %s", at, shownName(got), target)}
	case isWildcard(domain):
		return challengeChoice{}, &issuing.PreflightError{Msg: fmt.Sprintf(
			"a wildcard is validated over DNS-01 only: no CNAME at %s; set %s CNAME %s", at, at, target)}
	case got != "":
		http01.reason = fmt.Sprintf("%s is a CNAME to %s, not to %s", at, shownName(got), target)
	default:
		http01.reason = fmt.Sprintf("no CNAME at %s (for DNS-01, set it to %s)", at, target)
	}
	if i.preflight != nil && i.caaOnlyDNS01(ctx, domain) {
		return challengeChoice{}, &issuing.PreflightError{Msg: fmt.Sprintf(
			"the name's CAA records allow only dns-01 validation, and %s; set %s CNAME %s", http01.reason, at, target)}
	}
	return http01, nil
}

// shownName is a DNS name a tenant controls, as a message shows it: miekg/dns escapes
// every byte that is not printable, and it is cut to a name's longest.
func shownName(s string) string {
	if len(s) > 253 {
		s = s[:253] + "..."
	}
	return s
}

// negativeMargin is added to a negative answer's TTL before the DNS-01 probe asks
// again, for the resolver's clock and rounding of TTLs to whole seconds.
const negativeMargin = time.Second

// probeDNS01 writes a probe value at domain's target and checks that the resolver
// answers it by the tenant's name (at, through its CNAME), as the CA will ask. A
// negative answer is not taken at once: the probe is asked for again once that
// answer may have left the resolver's cache (at most the zone's negative TTL), so
// that a negative answer someone keeps warm there does not hold the name back.
// Nothing is sent to the CA; the probe is deleted after.
func (i *Issuer) probeDNS01(ctx context.Context, domain, at, target string) error {
	token, err := probeToken()
	if err != nil {
		return err
	}
	probeToken := "probe-" + token
	store := &valueStore{pool: i.pool, log: i.log, ctx: ctx, zone: i.cfg.DNS01Zone}
	if err := store.put(domain, probeToken, token, probeTTL); err != nil {
		return fmt.Errorf("acme: preflight: %w", err)
	}
	defer store.CleanUp(domain, probeToken, "") //nolint:errcheck // logged; it expires by itself
	values, negative, err := i.dns.txt(ctx, at)
	if err == nil && negative > 0 && !slices.Contains(values, token) {
		// A negative answer may be one the resolver kept from before the probe was
		// written: anyone can ask it for the target, which the name discloses, and
		// keep that answer warm. Wait it out, the probe in place, and ask again.
		wait := time.NewTimer(min(negative, dns01NegTTL*time.Second) + negativeMargin)
		select {
		case <-wait.C:
		case <-ctx.Done():
			wait.Stop()
			return fmt.Errorf("acme: preflight: %w", context.Cause(ctx))
		}
		values, _, err = i.dns.txt(ctx, at)
	}
	switch {
	case errors.Is(err, errResolverSilent):
		i.log.Warn("DNS-01 preflight skipped: the DNS resolver did not answer",
			issuing.LogDomainCtx(ctx, domain), zap.String("error", err.Error()))
		return nil
	case err != nil:
		return fmt.Errorf("acme: preflight: %w", err)
	}
	if slices.Contains(values, token) {
		return nil
	}
	return &issuing.PreflightError{Msg: fmt.Sprintf(
		"%s is a CNAME to %s, but the value written there is not answered by the name (%d other TXT values): is the zone delegated to certworker's name servers?",
		at, target, len(values))}
}
