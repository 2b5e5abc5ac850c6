package main

import (
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/certworker/certworker/acme"
)

// validateDNS checks the --dns-* and --dns01-* flags.
func (c *runCmd) validateDNS() error {
	if c.DNSWaitMax <= 0 {
		return usagef("--dns-wait-max: must be positive, got %s", c.DNSWaitMax)
	}
	if _, err := acme.ParseDNSTarget(c.DNSTarget); err != nil {
		return usagef("--dns-target: %v", err)
	}
	// Normalised here, once, so that the zone recorded for certworker_dns01_target,
	// the server and the issuer all get the same string.
	zone, err := acme.NormalizeDNS01Zone(c.DNS01Zone)
	if err != nil {
		return usagef("%v", err)
	}
	if c.DNS01Zone = zone; zone == "" {
		return nil
	}
	if len(c.nameservers()) == 0 {
		return usagef("--dns01-nameservers: required with --dns01-zone (the host names of the zone's NS records)")
	}
	if _, err := acme.ParseDNS01Nameservers(zone, c.nameservers()); err != nil {
		return usagef("%v", err)
	}
	if c.DNS01RateLimit < 0 {
		return usagef("--dns01-rate-limit: must not be negative, got %d", c.DNS01RateLimit)
	}
	if c.DNS01RateLimitSlip < 0 {
		return usagef("--dns01-rate-limit-slip: must not be negative, got %d", c.DNS01RateLimitSlip)
	}
	if _, err := acme.ParseDNS01RateLimitExempt(c.DNS01RateLimitExempt); err != nil {
		return usagef("%v", err)
	}
	if _, _, err := net.SplitHostPort(c.DNS01Listen); err != nil {
		return usagef("--dns01-listen: %q is not host:port", c.DNS01Listen)
	}
	return nil
}

// nameservers are --dns01-nameservers, split.
func (c *runCmd) nameservers() []string {
	var out []string
	for _, n := range strings.Split(c.DNS01Nameservers, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// dns01Sockets are the DNS-01 server's bound sockets; nil without --dns01-zone.
type dns01Sockets struct {
	pc net.PacketConn
	ln net.Listener
}

// listenDNS01 binds --dns01-listen, UDP and TCP, before anything else is started (as
// the HTTP-01 port is): a port already taken is a configuration error found before
// the worker places an order.
func (c *runCmd) listenDNS01() (*dns01Sockets, error) {
	if c.DNS01Zone == "" {
		return nil, nil
	}
	pc, err := net.ListenPacket("udp", c.DNS01Listen)
	if err != nil {
		return nil, usagef("--dns01-listen: cannot listen on UDP %s: %v", c.DNS01Listen, err)
	}
	ln, err := net.Listen("tcp", c.DNS01Listen)
	if err != nil {
		_ = pc.Close()
		return nil, usagef("--dns01-listen: cannot listen on TCP %s: %v", c.DNS01Listen, err)
	}
	return &dns01Sockets{pc: pc, ln: ln}, nil
}

func (s *dns01Sockets) close() {
	if s != nil {
		_ = s.pc.Close()
		_ = s.ln.Close()
	}
}

// serveDNS01 starts the zone's server on the bound sockets.
func (c *runCmd) serveDNS01(socks *dns01Sockets, pool *pgxpool.Pool, log *zap.Logger, reg prometheus.Registerer) (*acme.DNS01Server, error) {
	if socks == nil {
		return nil, nil
	}
	exempt, _ := acme.ParseDNS01RateLimitExempt(c.DNS01RateLimitExempt) // validateDNS checked it
	srv, err := acme.NewDNS01Server(pool, log, acme.DNS01Options{
		Zone: c.DNS01Zone, Nameservers: c.nameservers(), Registerer: reg,
		RateLimit: c.DNS01RateLimit, RateLimitSlip: c.DNS01RateLimitSlip, RateLimitExempt: exempt,
	})
	if err != nil {
		return nil, usagef("%v", err)
	}
	if err := srv.Serve(socks.pc, socks.ln); err != nil {
		return nil, usagef("--dns01-listen: %v", err)
	}
	log.Info("DNS-01 zone served", zap.String("zone", srv.Zone()), zap.String("listen", c.DNS01Listen))
	return srv, nil
}
