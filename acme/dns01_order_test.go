package acme_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/dnsresolver"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// dns01Bed is a world for DNS-01 by delegation: two instances' zone servers on one
// database, a resolver standing for the tenants' DNS and the public resolvers (it
// answers their CNAMEs with the target's TXT, asked of the two servers in turn), and
// a Pebble whose VA asks that resolver. Pebble's HTTP-01 port has nothing listening:
// an order validated over HTTP-01 fails.
type dns01Bed struct {
	ca       *pebbletest.CA
	pool     *pgxpool.Pool
	resolver *dnsresolver.Resolver
	servers  []string
	zone     string // as given to the servers and the issuer
}

func setupDNS01(t *testing.T) *dns01Bed {
	t.Helper()
	return setupDNS01Spelled(t, testZone)
}

// setupDNS01Spelled is setupDNS01 with the zone servers given zone as an operator
// wrote it (--dns01-zone), which config's DNS01Zone is then set to.
func setupDNS01Spelled(t *testing.T, zone string) *dns01Bed {
	t.Helper()
	b := &dns01Bed{resolver: workertest.StartResolver(t), zone: zone}
	var dsn string
	b.pool, dsn = pgtest.NewPool(t)
	b.servers = workertest.ServeZone(t, b.resolver, dsn, zone)
	b.ca = pebbletest.StartT(t, pebbletest.Options{DNSServer: b.resolver.Addr, HTTPPort: freePort(t)})
	return b
}

// freePort is a TCP port nothing listens on.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	return port
}

// config is an issuer with DNS-01 by delegation and the preflight, both asking the
// bed's resolver.
func (b *dns01Bed) config() acme.Config {
	cfg := caConfig(b.ca)
	cfg.Preflight = acme.PreflightHTTP
	cfg.PreflightResolver = b.resolver.Addr
	cfg.PreflightAllowCIDR = "127.0.0.0/8"
	cfg.PreflightPort = b.ca.HTTPPort
	cfg.DNS01Zone = b.zone
	return cfg
}

// delegate points _acme-challenge of name (a wildcard's base) at its target.
func (b *dns01Bed) delegate(name string) {
	b.resolver.SetCNAME("_acme-challenge."+trimWildcard(name), acme.DNS01Target(testZone, name))
}

func trimWildcard(name string) string {
	if len(name) > 2 && name[:2] == "*." {
		return name[2:]
	}
	return name
}

// A name whose _acme-challenge CNAME points at its target is issued over DNS-01
// before its A record exists (the name does not resolve at all), the value answered
// by both instances' servers in turn, and removed once the order is over; status says
// dns-01 and why. Guards against a delegation that still needs the name to point
// here, a value left in the zone, and a challenge chosen silently.
func TestDNS01_IssuedBeforeItsARecordExists(t *testing.T) {
	t.Parallel()
	b := setupDNS01(t)
	name := randomName("dns01-before-a")
	require.NoError(t, pebbletest.SetNoAddress(name))
	t.Cleanup(func() { pebbletest.ClearDNS(name) })
	b.delegate(name)
	id := pgtest.Domain(t, b.pool, pgtest.Tenant(t, b.pool), name)

	iss := newIssuer(t, b.pool, nil, b.config())
	cert, err := iss.Issue(testCtx(t, 2*time.Minute), issuing.Request{Domain: name, DomainID: id})
	require.NoError(t, err)
	leaf := parseChain(t, cert.ChainPEM)[0]
	require.Equal(t, []string{name}, leaf.DNSNames)
	require.Zero(t, countRows(t, b.pool, "certworker_dns01_values"), "values removed when the order is over")
	asked := b.resolver.Asked()
	for _, s := range b.servers {
		require.Positive(t, asked[s], "both instances answered (%v)", asked)
	}
	st, err := queue.New(b.pool, issuing.DefaultConfig()).State(context.Background(), name)
	require.NoError(t, err)
	require.NotNil(t, st.Challenge)
	require.Equal(t, issuing.ChallengeDNS01, *st.Challenge)
	require.Contains(t, *st.ChallengeReason, "_acme-challenge."+name+" is a CNAME to "+acme.DNS01Target(testZone, name))
}

// A wildcard is ordered as a dns identifier *.BASE over DNS-01 with its CNAME at
// _acme-challenge.BASE, and the certificate covers *.BASE. Guards against a wildcard
// sent over HTTP-01 (which the CA refuses) or its CNAME looked up under "*".
func TestDNS01_WildcardIssuedThroughItsBaseCNAME(t *testing.T) {
	t.Parallel()
	b := setupDNS01(t)
	base := randomName("dns01-wild")
	name := "*." + base
	b.delegate(name)
	iss := newIssuer(t, b.pool, nil, b.config())
	cert, err := iss.Issue(testCtx(t, 2*time.Minute), issuing.Request{Domain: name})
	require.NoError(t, err)
	leaf := parseChain(t, cert.ChainPEM)[0]
	require.Equal(t, []string{name}, leaf.DNSNames)
	orders := b.ca.Orders()
	require.Len(t, orders, 1)
	require.Equal(t, []string{name}, orders[0].Identifiers)
}

// A wildcard without its CNAME is not ordered: nothing is sent to the CA, and the
// error says what to set. Guards against an order bound to fail, charged against
// the CA's failed-validation limit.
func TestDNS01_WildcardWithoutItsCNAMEIsNotOrdered(t *testing.T) {
	t.Parallel()
	b := setupDNS01(t)
	base := randomName("dns01-wild-none")
	iss := newIssuer(t, b.pool, nil, b.config())
	_, err := iss.Issue(testCtx(t, time.Minute), issuing.Request{Domain: "*." + base})
	var pe *issuing.PreflightError
	require.True(t, errors.As(err, &pe), "%v", err)
	require.Contains(t, pe.Error(), "no CNAME at _acme-challenge."+base+"; set _acme-challenge."+base+" CNAME "+acme.DNS01Target(testZone, base))
	require.Zero(t, b.ca.OrderRequests())
}

// A CNAME in place whose target the zone's servers do not answer (the zone not
// delegated to them) fails the preflight before anything is sent. Guards against
// trusting the CNAME alone.
func TestDNS01_PreflightChecksTheValueIsVisible(t *testing.T) {
	t.Parallel()
	b := setupDNS01(t)
	b.resolver.Delegate(testZone) // the zone reaches no server of certworker's
	name := randomName("dns01-undelegated")
	b.delegate(name)
	iss := newIssuer(t, b.pool, nil, b.config())
	_, err := iss.Issue(testCtx(t, time.Minute), issuing.Request{Domain: name})
	var pe *issuing.PreflightError
	require.True(t, errors.As(err, &pe), "%v", err)
	require.Contains(t, pe.Error(), "the value written there is not answered by the name")
	require.Zero(t, b.ca.OrderRequests())
	require.Zero(t, countRows(t, b.pool, "certworker_dns01_values"), "the probe is removed")
}

// A CNAME that points elsewhere leaves the name on HTTP-01, and status says why.
// Guards against DNS-01 chosen for a CNAME the zone does not answer.
func TestDNS01_ACNAMEElsewhereMeansHTTP01(t *testing.T) {
	t.Parallel()
	b := setupDNS01(t)
	name := randomName("dns01-elsewhere")
	b.resolver.SetCNAME("_acme-challenge."+name, "acme.other-provider.example")
	id := pgtest.Domain(t, b.pool, pgtest.Tenant(t, b.pool), name)
	iss := newIssuer(t, b.pool, nil, b.config())
	_, err := iss.Issue(testCtx(t, time.Minute), issuing.Request{Domain: name, DomainID: id})
	var pe *issuing.PreflightError
	require.True(t, errors.As(err, &pe), "the HTTP-01 preflight ran (nothing listens): %v", err)
	st, err := queue.New(b.pool, issuing.DefaultConfig()).State(context.Background(), name)
	require.NoError(t, err)
	require.Equal(t, issuing.ChallengeHTTP01, *st.Challenge)
	require.Contains(t, *st.ChallengeReason, "is a CNAME to acme.other-provider.example, not to "+acme.DNS01Target(testZone, name))
}

// A zone written with capitals and a trailing dot is the same zone: the server, the
// values an order writes and the target the tenant is shown all use it in lower case
// without the dot, and the name is issued over DNS-01. Guards against the values
// being written under a target hashed from the zone as written, which the server
// never answers: every DNS-01 check then waits for ever and every wildcard with it.
func TestDNS01_ZoneWithCapitalsAndATrailingDotIssues(t *testing.T) {
	t.Parallel()
	b := setupDNS01Spelled(t, "ACME.certworker.test.")
	name := randomName("dns01-spelled")
	require.NoError(t, pebbletest.SetNoAddress(name))
	t.Cleanup(func() { pebbletest.ClearDNS(name) })
	b.delegate(name)
	iss := newIssuer(t, b.pool, nil, b.config())
	cert, err := iss.Issue(testCtx(t, 2*time.Minute), issuing.Request{Domain: name})
	require.NoError(t, err)
	require.Equal(t, []string{name}, parseChain(t, cert.ChainPEM)[0].DNSNames)
	orders := b.ca.Orders()
	require.Len(t, orders, 1)
}

// A CNAME to another target under the zone (another name's, or any label in it) is
// not the name's delegation: the name is validated over HTTP-01 or waits, never over
// DNS-01, with the preflight on or off. Guards against accepting any CNAME that
// merely ends with the zone, which would send a DNS-01 order bound to fail (the CA
// reads the other target's values) and charge it, with --preflight off.
func TestDNS01_ACNAMEToAnotherTargetInTheZoneIsNotDNS01(t *testing.T) {
	t.Parallel()
	b := setupDNS01(t)
	tenant := pgtest.Tenant(t, b.pool)
	for _, preflight := range []string{acme.PreflightHTTP, acme.PreflightOff} {
		t.Run(preflight, func(t *testing.T) {
			name := randomName("dns01-other-target")
			other := acme.DNS01Target(testZone, randomName("dns01-someone-else"))
			b.resolver.SetCNAME("_acme-challenge."+name, other)
			id := pgtest.Domain(t, b.pool, tenant, name)
			cfg := b.config()
			cfg.Preflight = preflight
			iss := newIssuer(t, b.pool, nil, cfg)
			_, err := iss.Issue(testCtx(t, time.Minute), issuing.Request{Domain: name, DomainID: id})
			require.Error(t, err, "nothing answers HTTP-01, and DNS-01 must not be tried")
			if preflight == acme.PreflightHTTP {
				var pe *issuing.PreflightError
				require.True(t, errors.As(err, &pe), "the name waits: %v", err)
			}
			st, err := queue.New(b.pool, issuing.DefaultConfig()).State(context.Background(), name)
			require.NoError(t, err)
			if preflight == acme.PreflightHTTP && st.Challenge == nil {
				return // a wait before any choice is recorded is also not DNS-01
			}
			require.NotNil(t, st.Challenge)
			require.Equal(t, issuing.ChallengeHTTP01, *st.Challenge)
			require.Contains(t, *st.ChallengeReason, "is a CNAME to "+other+", not to "+acme.DNS01Target(testZone, name))
		})
	}
}

// setupDNS01Responding is setupDNS01 with certworker's HTTP-01 responder on the port
// Pebble validates, so that a name pointed at 127.0.0.1 (challtestsrv's default
// answer) passes HTTP-01's preflight and can be issued over HTTP-01 too.
func setupDNS01Responding(t *testing.T) *dns01Bed {
	t.Helper()
	b := &dns01Bed{resolver: workertest.StartResolver(t), zone: testZone}
	var dsn string
	b.pool, dsn = pgtest.NewPool(t)
	b.servers = workertest.ServeZone(t, b.resolver, dsn, testZone)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	b.ca = pebbletest.StartT(t, pebbletest.Options{DNSServer: b.resolver.Addr, HTTPPort: ln.Addr().(*net.TCPAddr).Port})
	(&bed{ln: ln}).respond(t, b.pool, zap.NewNop())
	return b
}

// CAA's validationmethods is read for the challenge the order will use: a name whose
// records allow the CA only dns-01 is allowed, and waits for its CNAME without an
// order (though HTTP-01 would reach the proxy), then is issued over DNS-01 once the
// CNAME is set; a name delegated to the zone whose records allow only http-01 is
// refused the CA. Guards against CAA checked as http-01 for a name then validated
// over DNS-01: a tenant allowing only dns-01 was refused, and one allowing only
// http-01 was ordered over a challenge the CA refuses.
func TestDNS01_CAAIsReadForTheChallengeUsed(t *testing.T) {
	t.Parallel()
	b := setupDNS01Responding(t)
	r, err := acme.NewCAAResolver(b.resolver.Addr)
	require.NoError(t, err)
	iss := newIssuer(t, b.pool, nil, b.config())
	ctx := testCtx(t, 2*time.Minute)

	only := randomName("caa-dns01-only")
	setCAA(t, only, pebbletest.DefaultCAAIdentity+"; validationmethods=dns-01")
	v, err := acme.CheckCAAFor(ctx, r, only, iss)
	require.NoError(t, err)
	require.Equal(t, []bool{true}, v.Allowed, "allowed: the name can be validated over DNS-01 once delegated")
	_, err = iss.Issue(ctx, issuing.Request{Domain: only})
	var we *issuing.WaitingError
	require.True(t, errors.As(err, &we), "it waits for its CNAME: %v", err)
	target := acme.DNS01Target(testZone, only)
	require.Contains(t, we.Msg, "the name's CAA records allow only dns-01 validation")
	require.Contains(t, we.Msg, "set _acme-challenge."+only+" CNAME "+target)
	require.Zero(t, b.ca.OrderRequests(), "nothing sent to the CA")

	b.delegate(only)
	v, err = acme.CheckCAAFor(ctx, r, only, iss)
	require.NoError(t, err)
	require.Equal(t, []bool{true}, v.Allowed)
	cert, err := iss.Issue(ctx, issuing.Request{Domain: only})
	require.NoError(t, err)
	require.Equal(t, []string{only}, parseChain(t, cert.ChainPEM)[0].DNSNames)

	httpOnly := randomName("caa-http01-only")
	setCAA(t, httpOnly, pebbletest.DefaultCAAIdentity+"; validationmethods=http-01")
	b.delegate(httpOnly)
	v, err = acme.CheckCAAFor(ctx, r, httpOnly, iss)
	require.NoError(t, err)
	require.Equal(t, []bool{false}, v.Allowed, "delegated, it is validated over DNS-01, which its records forbid")
}
