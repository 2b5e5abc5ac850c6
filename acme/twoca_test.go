package acme_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue/issuing"
)

const (
	twoKID  = "kid-two"
	twoHMAC = "zWNDZM6eQGHWpSRTPal5eIUYFTu7EajVIoguysqZ9wG44nMEtx3MUAsUDkMTQ12W"
)

// second starts a second, independent CA for the bed: its own ports, roots and
// account store, the CAA identity pebble-two.test, external account binding
// required, validating HTTP-01 on the bed's port (where the bed's responder answers
// from the same database), and returns an issuer configuration for it.
func (b *bed) second(t *testing.T) (*pebbletest.CA, acme.Config) {
	t.Helper()
	ca := pebbletest.StartT(t, pebbletest.Options{
		HTTPPort: b.ca.HTTPPort, CAAIdentity: "pebble-two.test",
		RequireEAB: true, EABKeys: map[string]string{twoKID: twoHMAC},
	})
	cfg := b.config()
	cfg.DirectoryURL, cfg.CABundle = ca.DirectoryURL, ca.RootsFile
	cfg.EABKeyID, cfg.EABHMAC = twoKID, twoHMAC
	return ca, cfg
}

// Two Pebbles in one test process issue independently, each for the orders sent to
// it, with an account of its own (the second's bound by EAB) in the same database;
// each advertises its own CAA identity, and CAAIssuer gives each issuer's identity
// and account. Guards the two-CA tests of issue 19 against CAs that share state, or
// an issuer that reports the other CA's identity or account.
func TestTwoCAs_IssueIndependentlyWithTheirOwnIdentities(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{CAAIdentity: "pebble-one.test"}, true)
	two, twoCfg := b.second(t)
	require.NotEqual(t, b.ca.DirectoryURL, two.DirectoryURL)
	require.NotEqual(t, b.ca.RootsPEM(), two.RootsPEM())
	first, second := newIssuer(t, b.pool, nil, b.config()), newIssuer(t, b.pool, nil, twoCfg)

	ctx := testCtx(t, time.Minute)
	ca1, err := first.CAAIssuer(ctx)
	require.NoError(t, err)
	require.Equal(t, acme.CAAIssuer{Identities: []string{"pebble-one.test"}, Method: acme.ValidationHTTP01}, ca1, "no account yet")

	n1, n2 := randomName("one"), randomName("two")
	_, err = first.Issue(ctx, issuing.Request{Domain: n1})
	require.NoError(t, err)
	cert, err := second.Issue(ctx, issuing.Request{Domain: n2})
	require.NoError(t, err)
	require.Len(t, b.ca.Orders(), 1)
	require.Equal(t, []string{n1}, b.ca.Orders()[0].Identifiers)
	require.Len(t, two.Orders(), 1)
	require.Equal(t, []string{n2}, two.Orders()[0].Identifiers)
	require.Equal(t, 1, b.ca.NewAccounts())
	require.Equal(t, 1, two.NewAccounts())
	// The certificate chains to the second CA's roots, not the first's.
	chain := parseChain(t, cert.ChainPEM)
	require.Equal(t, []string{n2}, chain[0].DNSNames)

	var kids []string
	rows, err := b.pool.Query(ctx, `SELECT eab_kid FROM certworker_acme_accounts ORDER BY eab_kid`)
	require.NoError(t, err)
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		kids = append(kids, k)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"", twoKID}, kids)

	ca1, err = first.CAAIssuer(ctx)
	require.NoError(t, err)
	ca2, err := second.CAAIssuer(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"pebble-two.test"}, ca2.Identities)
	require.NotEmpty(t, ca1.AccountURI)
	require.NotEmpty(t, ca2.AccountURI)
	require.NotEqual(t, ca1.AccountURI, ca2.AccountURI)
	// Another instance, which has not ordered yet, reads the account from the
	// database.
	ca2Again, err := newIssuer(t, b.newPool(t), nil, twoCfg).CAAIssuer(ctx)
	require.NoError(t, err)
	require.Equal(t, ca2, ca2Again)

	// --acme-caa-identities replaces the directory's.
	cfg := b.config()
	cfg.CAAIdentities = []string{"letsencrypt.org"}
	ids, err := newIssuer(t, b.pool, nil, cfg).CAAIdentities(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"letsencrypt.org"}, ids)
}

// A name's CAA records read through the DNS the CAs share decide between the two
// CAs by their identities and by the account each orders with (RFC 8657
// accounturi). Guards against a check that compares with the wrong CA's identity or
// account, which would send a name to a CA its records forbid.
func TestTwoCAs_CAADecidesByIdentityAndAccount(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{CAAIdentity: "pebble-one.test"}, true)
	_, twoCfg := b.second(t)
	first, second := newIssuer(t, b.pool, nil, b.config()), newIssuer(t, b.pool, nil, twoCfg)
	ctx := testCtx(t, time.Minute)
	_, err := second.Issue(ctx, issuing.Request{Domain: randomName("register")})
	require.NoError(t, err)
	ca1, err := first.CAAIssuer(ctx)
	require.NoError(t, err)
	ca2, err := second.CAAIssuer(ctx)
	require.NoError(t, err)

	r, err := acme.NewCAAResolver(b.ca.DNSServer)
	require.NoError(t, err)
	name := randomName("caa")
	setCAA(t, name, "pebble-one.test; accounturi=https://elsewhere.example/acct/1", "pebble-two.test; accounturi="+ca2.AccountURI)
	v, err := acme.CheckCAA(ctx, r, name, ca1, ca2)
	require.NoError(t, err)
	require.Equal(t, []bool{false, true}, v.Allowed)
	v, err = acme.CheckCAAFor(ctx, r, name, first, second)
	require.NoError(t, err)
	require.Equal(t, []bool{false, true}, v.Allowed, "from the issuers themselves")
	v, err = acme.CheckCAAFor(ctx, r, name, first)
	require.NoError(t, err)
	require.ErrorContains(t, v.Err(), "caa: the CAA records of "+name+" allow only pebble-one.test, pebble-two.test,")
}

// A CA's caa refusal from the test front (Pebble checks no CAA), at new-order or at
// finalize, is a permanent failure with the caa problem, and nothing is issued.
// Guards the front's caa rule, which the fallback tests rely on to make the first CA
// refuse a name.
func TestFront_RefusesANameWithCAA(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	front := pebbletest.NewFront(t, b.ca)
	cfg := b.config()
	cfg.DirectoryURL = front.DirectoryURL
	iss := newIssuer(t, b.pool, nil, cfg)
	atOrder, atFinalize, other := randomName("order"), randomName("finalize"), randomName("other")
	front.Add(pebbletest.Rule{Step: pebbletest.StepNewOrder, Names: []string{atOrder}, Answer: pebbletest.CAAForbidden(atOrder)})
	front.Add(pebbletest.Rule{Step: pebbletest.StepFinalize, Names: []string{atFinalize}, Answer: pebbletest.CAAForbidden(atFinalize)})

	for _, name := range []string{atOrder, atFinalize} {
		_, err := iss.Issue(testCtx(t, time.Minute), issuing.Request{Domain: name})
		var pe *issuing.PermanentError
		require.True(t, errors.As(err, &pe), "%s: %v", name, err)
		require.Contains(t, err.Error(), "urn:ietf:params:acme:error:caa: While processing CAA for "+name)
	}
	_, err := iss.Issue(testCtx(t, time.Minute), issuing.Request{Domain: other})
	require.NoError(t, err, "other names pass")
	require.Equal(t, map[pebbletest.Step]int{pebbletest.StepNewOrder: 1, pebbletest.StepFinalize: 1}, front.Answered())
	for _, o := range b.ca.Orders() {
		require.Equal(t, o.Identifiers[0] == other, o.Finalized, "%v", o.Identifiers)
	}
}

// A binding the CA refuses met by an order (the CA was down at start, or the account
// was forgotten) is the operator's: a *issuing.CAUnavailableError holding an
// *acme.EABRefusedError, not charged to the name, and the HMAC key is in neither the
// error nor the log. Guards against every due domain being charged, and failed, for
// the operator's key.
func TestIssue_ARefusedBindingIsNotTheDomainsAndLeaksNoKey(t *testing.T) {
	t.Parallel()
	const wrong = "HnR8mdV8Ub0n7Lr1G3J9yXmvL2gQ5pZkT4sWc6aEoYfB0iNuD3hKxPjq7MtSw1Ra"
	b := setup(t, pebbletest.Options{}, true)
	two, cfg := b.second(t)
	cfg.EABHMAC = wrong
	core, logs := observer.New(zap.DebugLevel)
	iss := newIssuer(t, b.pool, zap.New(core), cfg)
	_, err := iss.Issue(testCtx(t, time.Minute), issuing.Request{Domain: randomName("eab")})
	var unavailable *issuing.CAUnavailableError
	require.True(t, errors.As(err, &unavailable), "%v", err)
	var refused *acme.EABRefusedError
	require.True(t, errors.As(err, &refused))
	require.Equal(t, twoKID, refused.KeyID)
	require.Contains(t, err.Error(), "refused the external account binding with key id "+twoKID+" (urn:ietf:params:acme:error:unauthorized: ")
	require.NotContains(t, err.Error(), wrong)
	for _, e := range logs.All() {
		require.NotContains(t, e.Message, wrong)
		for _, f := range e.Context {
			require.NotContains(t, f.String, wrong)
			if fe, ok := f.Interface.(error); ok {
				require.NotContains(t, fe.Error(), wrong)
			}
		}
	}
	require.Zero(t, two.NewAccounts())
	require.Zero(t, two.OrderRequests())

	// RegisterAccount, run's check at start, says the same without the wrapper.
	err = iss.RegisterAccount(context.Background())
	require.True(t, errors.As(err, &refused), "%v", err)
	require.False(t, errors.As(err, &unavailable))
}

// A CA whose directory has not answered since the worker started (and no
// --acme-caa-identities) is left undecided by CheckCAAFor, not refused: with records
// that name only it, the domain is held back uncharged (a *issuing.CAUnavailableError),
// never failed; the other CA is still decided. Guards against a primary CA's outage
// failing for good every domain whose records name only that CA.
func TestCheckCAAFor_ACAThatCannotBeAskedIsUndecided(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{CAAIdentity: "pebble-one.test"}, false)
	down := b.config()
	down.DirectoryURL = "https://" + workertest.FreeAddr(t) + "/dir"
	first, second := newIssuer(t, b.pool, nil, down), newIssuer(t, b.pool, nil, b.config())
	r, err := acme.NewCAAResolver(b.ca.DNSServer)
	require.NoError(t, err)
	ctx := testCtx(t, time.Minute)

	onlyDown := randomName("down")
	setCAA(t, onlyDown, "letsencrypt.org")
	v, err := acme.CheckCAAFor(ctx, r, onlyDown, first, second)
	require.NoError(t, err)
	require.Equal(t, []bool{false, false}, v.Allowed)
	require.Equal(t, []bool{true, false}, v.Undecided)
	var cu *issuing.CAUnavailableError
	require.True(t, errors.As(v.Err(), &cu), "%v", v.Err())

	upToo := randomName("up")
	setCAA(t, upToo, "letsencrypt.org", "pebble-one.test")
	v, err = acme.CheckCAAFor(ctx, r, upToo, first, second)
	require.NoError(t, err)
	require.Equal(t, []bool{false, true}, v.Allowed)
	require.NoError(t, v.Err())
}
