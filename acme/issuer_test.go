package acme_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-acme/lego/v4/certcrypto"
	"github.com/go-acme/lego/v4/certificate"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/certstore/seal"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue/issuing"
)

// The whole path: order, HTTP-01 answered from PostgreSQL by HTTP01Handler, chain,
// key, renewal time. Guards against the wiring between Present, the token table and
// the responder breaking, a chain returned in the wrong order or without its
// intermediate, a key that does not match the leaf, and a missing renewal time
// (which would renew the certificate on every pass, or never).
func TestIssue_ObtainsCertificateThroughHTTP01Responder(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	iss := newIssuer(t, b.pool, nil, b.config())
	name := randomName("a")

	cert, err := iss.Issue(testCtx(t, 30*time.Second), issuing.Request{DomainID: "d-1", Domain: name})
	require.NoError(t, err)

	chain := parseChain(t, cert.ChainPEM)
	require.GreaterOrEqual(t, len(chain), 2, "the chain must carry the intermediate")
	leaf := chain[0]
	require.NoError(t, leaf.VerifyHostname(name))
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(b.ca.IssuerRootsPEM()))
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err = leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, Intermediates: inter})
	require.NoError(t, err, "the chain must verify up to Pebble's root, leaf first")

	require.Equal(t, leaf.NotBefore, cert.NotBefore)
	require.Equal(t, leaf.NotAfter, cert.NotAfter)
	require.Equal(t, leaf.SerialNumber.Text(16), cert.Serial)
	require.Equal(t, leaf.Issuer.String(), cert.Issuer)
	require.Contains(t, cert.Issuer, "Pebble Intermediate CA")
	require.False(t, cert.RenewAt.IsZero(), "RenewAt must be set")
	require.True(t, cert.RenewAt.Before(cert.NotAfter), "RenewAt %s must come before NotAfter %s", cert.RenewAt, cert.NotAfter)
	require.True(t, cert.RenewAt.After(cert.NotBefore), "RenewAt %s must come after NotBefore %s", cert.RenewAt, cert.NotBefore)

	require.True(t, strings.HasPrefix(cert.PrivateKey, "-----BEGIN PRIVATE KEY-----"), "without a key encryption key the key is PKCS #8 PEM")
	key, err := certcrypto.ParsePEMPrivateKey([]byte(cert.PrivateKey))
	require.NoError(t, err)
	require.True(t, key.(crypto.Signer).Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(leaf.PublicKey),
		"the key must be the leaf's")
	_, isEC := key.(*ecdsa.PrivateKey)
	require.True(t, isEC, "the default key type is ec256")

	require.Zero(t, countRows(t, b.pool, "certworker_http01_tokens"), "the token must be deleted after the challenge")
	require.Equal(t, 1, countRows(t, b.pool, "certworker_acme_accounts"))
	orders := b.ca.Orders()
	require.Len(t, orders, 1)
	require.Equal(t, []string{name}, orders[0].Identifiers)
	require.Empty(t, orders[0].Replaces, "a first issuance replaces nothing")
}

// The CA's validation request may reach any instance behind the load balancer. Here
// the order is placed by instance A, and only instance B's responder (its own pool)
// is reachable. Guards against tokens kept in process memory, or written in a
// transaction not yet committed when the CA is told to validate.
func TestIssue_ChallengeAnsweredByAnotherInstance(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, false)
	poolA, poolB := b.newPool(t), b.newPool(t)
	b.respond(t, poolB, nil)
	issA := newIssuer(t, poolA, nil, b.config())

	name := randomName("b")
	cert, err := issA.Issue(testCtx(t, 30*time.Second), issuing.Request{DomainID: "d-2", Domain: name})
	require.NoError(t, err)
	require.NoError(t, parseChain(t, cert.ChainPEM)[0].VerifyHostname(name))
}

// Two instances starting on an empty database with orders to place must share one
// ACME account. Guards against each instance registering its own (orphaned accounts
// at the CA, rate limits split across them) or a unique violation failing one order.
func TestAccount_OnePerDirectoryWhenInstancesStartTogether(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	issuers := []*acme.Issuer{
		newIssuer(t, b.newPool(t), nil, b.config()),
		newIssuer(t, b.newPool(t), nil, b.config()),
	}
	ctx := testCtx(t, 30*time.Second)
	var wg sync.WaitGroup
	errs := make([]error, len(issuers)*2)
	for n := range errs {
		wg.Go(func() {
			_, errs[n] = issuers[n%2].Issue(ctx, issuing.Request{Domain: randomName("c")})
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, 1, countRows(t, b.pool, "certworker_acme_accounts"))
	require.Equal(t, 1, b.ca.NewAccounts(), "exactly one account must be registered at the CA")
	require.Len(t, b.ca.Orders(), len(errs))

	// A restart (a new Issuer) reuses it.
	_, err := newIssuer(t, b.pool, nil, b.config()).Issue(ctx, issuing.Request{Domain: randomName("c")})
	require.NoError(t, err)
	require.Equal(t, 1, b.ca.NewAccounts(), "a restarted instance must reuse the stored account")
}

// A renewal names the certificate it replaces (RFC 9773), so that the CA exempts it
// from rate limits and knows the old one may be retired; it asks for the configured
// profile; and a short certificate renews inside the CA's suggested window. Guards
// against renewals ordered as new certificates and against a renewal time computed
// for 90-day certificates applied to a 5-minute one.
func TestIssue_RenewalNamesReplacedCertificate(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{ShortLifetime: 5 * time.Minute}, true)
	cfg := b.config()
	cfg.Profile = pebbletest.ShortProfile
	iss := newIssuer(t, b.pool, nil, cfg)
	name := randomName("r")
	ctx := testCtx(t, 30*time.Second)

	first, err := iss.Issue(ctx, issuing.Request{Domain: name})
	require.NoError(t, err)
	lifetime := first.NotAfter.Sub(first.NotBefore)
	require.InDelta(t, (5 * time.Minute).Seconds(), lifetime.Seconds(), 2, "the short profile must be used")

	second, err := iss.Issue(ctx, issuing.Request{Domain: name, CurrentPEM: first.ChainPEM})
	require.NoError(t, err)
	require.NotEqual(t, first.Serial, second.Serial, "a renewal is a new certificate")

	orders := b.ca.Orders()
	require.Len(t, orders, 2)
	wantID, err := certificate.MakeARICertID(parseChain(t, first.ChainPEM)[0])
	require.NoError(t, err)
	require.Equal(t, wantID, orders[1].Replaces, "the renewal order must name the certificate it replaces")
	require.Equal(t, pebbletest.ShortProfile, orders[0].Profile)
	require.Equal(t, pebbletest.ShortProfile, orders[1].Profile)

	// Pebble's window for a 5-minute certificate is its whole validity: the renewal
	// time falls inside it, from now on.
	require.False(t, second.RenewAt.Before(second.NotBefore), "RenewAt %s before NotBefore %s", second.RenewAt, second.NotBefore)
	require.True(t, second.RenewAt.Before(second.NotAfter), "RenewAt %s not before NotAfter %s", second.RenewAt, second.NotAfter)
}

// Pebble rejecting nonces (lego must retry badNonce) and sleeping before validating
// (lego must poll until the authorization is decided) is what a real CA under load
// looks like. Guards against treating badNonce as a failure, or giving up polling.
func TestIssue_SucceedsDespiteNonceRejectionAndValidationSleep(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{NonceReject: 30, ValidationSleep: true, SleepSeconds: 3}, true)
	iss := newIssuer(t, b.pool, nil, b.config())
	name := randomName("n")
	cert, err := iss.Issue(testCtx(t, 45*time.Second), issuing.Request{Domain: name})
	require.NoError(t, err)
	require.NoError(t, parseChain(t, cert.ChainPEM)[0].VerifyHostname(name))
}

// --key-type decides the certificate's key. Guards against the flag being parsed but
// not passed on (every certificate ec256 whatever the operator asked).
func TestIssue_KeyTypeDecidesCertificateKey(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	for _, tc := range []struct {
		keyType string
		check   func(t *testing.T, pub crypto.PublicKey)
	}{
		{"ec256", func(t *testing.T, pub crypto.PublicKey) {
			require.Equal(t, elliptic.P256(), pub.(*ecdsa.PublicKey).Curve)
		}},
		{"ec384", func(t *testing.T, pub crypto.PublicKey) {
			require.Equal(t, elliptic.P384(), pub.(*ecdsa.PublicKey).Curve)
		}},
		{"rsa2048", func(t *testing.T, pub crypto.PublicKey) {
			require.Equal(t, 2048, pub.(*rsa.PublicKey).N.BitLen())
		}},
		{"rsa4096", func(t *testing.T, pub crypto.PublicKey) {
			require.Equal(t, 4096, pub.(*rsa.PublicKey).N.BitLen())
		}},
	} {
		t.Run(tc.keyType, func(t *testing.T) {
			t.Parallel()
			cfg := b.config()
			cfg.KeyType = tc.keyType
			cert, err := newIssuer(t, b.pool, nil, cfg).Issue(testCtx(t, 60*time.Second), issuing.Request{Domain: randomName("k")})
			require.NoError(t, err)
			tc.check(t, parseChain(t, cert.ChainPEM)[0].PublicKey)
		})
	}
}

// With a key encryption key, both the certificate's key and the account's are stored
// sealed, bound to their row. Guards against a key stored in the clear when the
// operator asked for encryption.
func TestIssue_SealsKeysWithKeyEncryptionKey(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	kek := make([]byte, 32)
	for i := range kek {
		kek[i] = byte(i + 1)
	}
	cfg := b.config()
	cfg.KeyEncryptionKeys = seal.Keyring{kek}
	name := randomName("s")
	cert, err := newIssuer(t, b.pool, nil, cfg).Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: name})
	require.NoError(t, err)

	require.True(t, strings.HasPrefix(cert.PrivateKey, seal.PrefixV2+seal.KeyID(kek)+":"), "certificate key must be sealed, naming its key")
	require.NotContains(t, cert.PrivateKey, "PRIVATE KEY")
	keyPEM, err := cfg.KeyEncryptionKeys.Open(cert.PrivateKey, name)
	require.NoError(t, err)
	key, err := certcrypto.ParsePEMPrivateKey(keyPEM)
	require.NoError(t, err)
	require.True(t, key.(crypto.Signer).Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(parseChain(t, cert.ChainPEM)[0].PublicKey))
	_, err = cfg.KeyEncryptionKeys.Open(cert.PrivateKey, "other.example")
	require.ErrorIs(t, err, seal.ErrUnseal, "a key moved to another domain's row must not open")

	var stored string
	require.NoError(t, b.pool.QueryRow(context.Background(),
		"SELECT private_key_pem FROM certworker_acme_accounts").Scan(&stored))
	require.True(t, seal.IsSealed(stored), "the account key must be sealed")
	_, err = cfg.KeyEncryptionKeys.Open(stored, b.ca.DirectoryURL)
	require.NoError(t, err)

	// Another instance in the middle of a rotation (a new key first, the old one
	// still listed) opens the account sealed under the old key and reuses it.
	rotated := cfg
	rotated.KeyEncryptionKeys = seal.Keyring{make([]byte, 32), kek}
	_, err = newIssuer(t, b.newPool(t), nil, rotated).Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: randomName("s")})
	require.NoError(t, err)
	require.Equal(t, 1, b.ca.NewAccounts())
}

// A CA that requires external account binding gets it, and the account row is keyed
// by the EAB key id. Guards against --acme-eab-kid/--acme-eab-hmac being ignored.
func TestIssue_ExternalAccountBinding(t *testing.T) {
	t.Parallel()
	const kid, hmac = "kid-1", "zWNDZM6eQGHWpSRTPal5eIUYFTu7EajVIoguysqZ9wG44nMEtx3MUAsUDkMTQ12W"
	b := setup(t, pebbletest.Options{RequireEAB: true, EABKeys: map[string]string{kid: hmac}}, true)

	_, err := newIssuer(t, b.pool, nil, b.config()).Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: randomName("e")})
	require.Error(t, err)
	require.Contains(t, err.Error(), "urn:ietf:params:acme:error:externalAccountRequired")

	cfg := b.config()
	cfg.EABKeyID, cfg.EABHMAC = kid, hmac
	_, err = newIssuer(t, b.pool, nil, cfg).Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: randomName("e")})
	require.NoError(t, err)
	var storedKid string
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT eab_kid FROM certworker_acme_accounts").Scan(&storedKid))
	require.Equal(t, kid, storedKid)
}

// The lifetime rule (a third left from 10 days up, half below),
// exported for hand-uploaded certificates. Guards against a rule that drifts from the
// queue's (they must agree) or from docs/cas.md.
func TestRenewAtFromValidity_AThirdLeftOrHalfBelowTenDays(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	require.Equal(t, start.Add(60*day), acme.RenewAtFromValidity(start, start.Add(90*day)))
	require.Equal(t, start.Add(3*day), acme.RenewAtFromValidity(start, start.Add(6*day)))
	require.Equal(t, start.Add(80*time.Hour), acme.RenewAtFromValidity(start, start.Add(160*time.Hour)))
	require.Equal(t, issuing.RenewAtFromValidity(start, start.Add(47*day)), acme.RenewAtFromValidity(start, start.Add(47*day)))
}

// An order whose lease renewals are failing (less than a third of the lease left
// before its deadline) goes as far as its validation but does not finalize (issue
// #17): a finalize makes the CA issue, and an order stopped by its deadline between
// the finalize and the download would leave a certificate issued that nobody stores,
// while the domain is ordered again.
func TestIssue_DoesNotFinalizeOnceItsLeaseRenewalsFail(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	// The last renewal was sent 40 s into a 60 s lease: 17 s left, one renewal missed.
	d := issuing.NewDeadline(time.Now().Add(-40*time.Second), time.Minute)
	name := randomName("f")
	_, err := newIssuer(t, b.pool, nil, b.config()).Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: name, Deadline: d})
	require.ErrorIs(t, err, issuing.ErrLeaseDeadline)
	require.Contains(t, err.Error(), "not finalizing")
	require.Len(t, b.ca.Orders(), 1, "the order was not placed")
	require.False(t, b.ca.Orders()[0].Finalized)
	require.Zero(t, b.ca.Requests()[pebbletest.StepFinalize], "a finalize reached the CA")
}
