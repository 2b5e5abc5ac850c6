package acme_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue/issuing"
)

// caaResolver asks the process's test DNS server, as --preflight-resolver would.
func caaResolver(t *testing.T) *acme.CAAResolver {
	t.Helper()
	addr, err := pebbletest.DNSAddress()
	require.NoError(t, err)
	r, err := acme.NewCAAResolver(addr)
	require.NoError(t, err)
	return r
}

// setCAA gives name CAA records (issue properties, unflagged) until the test ends.
func setCAA(t *testing.T, name string, issue ...string) {
	t.Helper()
	var recs []pebbletest.CAA
	for _, v := range issue {
		recs = append(recs, pebbletest.CAA{Tag: "issue", Value: v})
	}
	require.NoError(t, pebbletest.SetCAA(name, recs...))
	t.Cleanup(func() { pebbletest.ClearDNS(name) })
}

var (
	caaFirst  = acme.CAAIssuer{Identities: []string{"pebble-one.test"}, Method: acme.ValidationHTTP01}
	caaSecond = acme.CAAIssuer{Identities: []string{"pebble-two.test"}, Method: acme.ValidationHTTP01}
)

// The relevant RRset is the first non-empty one climbing from the name towards the
// root (RFC 8659 §3): the name's own when it has one, else its nearest parent's; a
// name none of whose parents has records allows every CA; a parent that does not
// exist (NXDOMAIN) is climbed past. Guards against reading only the name's own
// records (a tenant's CAA is usually on the registered domain) or the farthest.
func TestCheckCAA_ClimbsToTheNearestRRset(t *testing.T) {
	t.Parallel()
	r := caaResolver(t)
	base := randomName("caa")
	setCAA(t, base, "pebble-one.test")
	setCAA(t, "near."+base, "pebble-two.test")

	for _, tc := range []struct {
		name, at string
		allowed  []bool
	}{
		{base, base, []bool{true, false}},
		{"www." + base, base, []bool{true, false}},
		{"a.b.c." + base, base, []bool{true, false}},
		{"near." + base, "near." + base, []bool{false, true}},
		{"x.near." + base, "near." + base, []bool{false, true}},
		{randomName("free"), "", []bool{true, true}},
	} {
		v, err := acme.CheckCAA(testCtx(t, 20*time.Second), r, tc.name, caaFirst, caaSecond)
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.at, v.Set.Domain, tc.name)
		require.Equal(t, tc.allowed, v.Allowed, tc.name)
	}

	gone := "gone." + base
	require.NoError(t, pebbletest.SetNoAddress(gone))
	t.Cleanup(func() { pebbletest.ClearDNS(gone) })
	v, err := acme.CheckCAA(testCtx(t, 20*time.Second), r, "www."+gone, caaFirst, caaSecond)
	require.NoError(t, err, "NXDOMAIN is an empty RRset")
	require.Equal(t, base, v.Set.Domain)
	require.Equal(t, []bool{true, false}, v.Allowed)
}

// A name that is an alias (CNAME) has its target's CAA RRset; when the target has
// none, the climb goes on from the alias's parent, not the target's (RFC 8659 §3,
// which dropped RFC 6844's climb from the target). Guards against a CNAME to a
// hosting provider making the provider's records, or none, decide for the tenant.
func TestCheckCAA_FollowsCNAMEAndClimbsFromTheAlias(t *testing.T) {
	t.Parallel()
	r := caaResolver(t)
	tenant, provider := randomName("tenant"), randomName("provider")
	setCAA(t, tenant, "pebble-one.test")
	setCAA(t, provider, "pebble-two.test")
	setCAA(t, "edge."+provider, "pebble-two.test; validationmethods=http-01")

	alias := "shop." + tenant
	require.NoError(t, pebbletest.SetCNAME(alias, "edge."+provider))
	t.Cleanup(func() { pebbletest.ClearDNS(alias) })
	v, err := acme.CheckCAA(testCtx(t, 20*time.Second), r, alias, caaFirst, caaSecond)
	require.NoError(t, err)
	require.Equal(t, alias, v.Set.Domain, "the alias's RRset is its target's")
	require.Equal(t, []bool{false, true}, v.Allowed)

	bare := "bare." + tenant
	require.NoError(t, pebbletest.SetCNAME(bare, "cdn."+provider))
	t.Cleanup(func() { pebbletest.ClearDNS(bare) })
	v, err = acme.CheckCAA(testCtx(t, 20*time.Second), r, bare, caaFirst, caaSecond)
	require.NoError(t, err)
	require.Equal(t, tenant, v.Set.Domain, "a target without records: the climb goes on from the alias's parent")
	require.Equal(t, []bool{true, false}, v.Allowed)
}

// A look-up that fails (SERVFAIL, at the name or at a parent on the way up) is a
// *acme.CAAError, not forbidden, with a message starting caa: that names the name
// and the DNS's answer: the tenant's DNS, charged and retried. Guards against a
// broken zone read as "no records" (every CA allowed: the CA that checks would
// refuse) or as a refusal (failed for good).
func TestCheckCAA_ServFailIsALookupError(t *testing.T) {
	t.Parallel()
	r := caaResolver(t)
	base := randomName("servfail")
	require.NoError(t, pebbletest.SetServFail(base))
	t.Cleanup(func() { pebbletest.ClearDNS(base) })
	for _, name := range []string{base, "www." + base} {
		_, err := acme.CheckCAA(testCtx(t, 20*time.Second), r, name, caaFirst, caaSecond)
		var ce *acme.CAAError
		require.True(t, errors.As(err, &ce), "%v", err)
		require.False(t, ce.Forbidden)
		var pe *issuing.PermanentError
		require.False(t, errors.As(err, &pe), "a failed look-up is retried")
		var pf *issuing.PreflightError
		require.True(t, errors.As(err, &pf), "the worker charges it as a failed preflight")
		require.Equal(t, "caa: the DNS look-up of the CAA records of "+base+" failed: SERVFAIL", err.Error())
	}
}

// A record flagged critical whose tag certworker does not know forbids every CA,
// and the verdict says which tag (RFC 8659 §4.1); records allowing neither CA fail
// the domain at once, naming the CAs they allow. Read through DNS, so that the flag
// is carried from the wire.
func TestCheckCAA_CriticalUnknownTagAndNeitherAllowed(t *testing.T) {
	t.Parallel()
	r := caaResolver(t)
	name := randomName("critical")
	require.NoError(t, pebbletest.SetCAA(name,
		pebbletest.CAA{Tag: "issue", Value: "pebble-one.test"},
		pebbletest.CAA{Flag: 128, Tag: "tbs", Value: "unknown"}))
	t.Cleanup(func() { pebbletest.ClearDNS(name) })
	v, err := acme.CheckCAA(testCtx(t, 20*time.Second), r, name, caaFirst, caaSecond)
	require.NoError(t, err)
	require.Equal(t, []bool{false, false}, v.Allowed)
	require.Equal(t, "tbs", v.CriticalTag)
	require.ErrorContains(t, v.Err(), `caa: the CAA records of `+name+` hold a critical property "tbs"`)

	other := randomName("neither")
	setCAA(t, other, "sectigo.com", "pki.goog")
	v, err = acme.CheckCAA(testCtx(t, 20*time.Second), r, "www."+other, caaFirst, caaSecond)
	require.NoError(t, err)
	require.False(t, v.AnyAllowed())
	var pe *issuing.PermanentError
	require.True(t, errors.As(v.Err(), &pe))
	var pf *issuing.PreflightError
	require.False(t, errors.As(v.Err(), &pf), "a refusal is not a failed look-up")
	require.ErrorContains(t, v.Err(), "caa: the CAA records of www."+other+" (found at "+other+") allow only sectigo.com, pki.goog,")
}

// A look-up given up by its caller (the order cancelled) is the caller's error, not
// a verdict on the name. Guards against a shutdown charging every domain in flight.
func TestCheckCAA_CancelledIsNotCharged(t *testing.T) {
	t.Parallel()
	r := caaResolver(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := acme.CheckCAA(ctx, r, randomName("cancel"), caaFirst)
	require.ErrorIs(t, err, context.Canceled)
	var ce *acme.CAAError
	require.False(t, errors.As(err, &ce))
}

// A name that is not a DNS name is refused without a query; an IP address has no
// CAA (every CA may issue).
func TestCheckCAA_HostileNames(t *testing.T) {
	t.Parallel()
	r := caaResolver(t)
	for _, name := range []string{"", "a..example", "exa mple.com", "*.*.example.com", "x.*.example.com"} {
		_, err := acme.CheckCAA(testCtx(t, 5*time.Second), r, name, caaFirst)
		var ce *acme.CAAError
		require.True(t, errors.As(err, &ce), "%q: %v", name, err)
	}
	v, err := acme.CheckCAA(testCtx(t, 5*time.Second), r, "192.0.2.1", caaFirst)
	require.NoError(t, err)
	require.Equal(t, []bool{true}, v.Allowed)
}
