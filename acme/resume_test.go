package acme_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/go-acme/lego/v4/certificate"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// A renewal whose "replaces" the CA answers with alreadyReplaced is not sent again
// without it: lego's own re-post is refused by the order's transport, and the issuer
// says the name must wait, uncharged. Sent, that order would count against every
// limit the renewal is exempt from. Guards against lego's silent second order.
func TestIssue_AnAlreadyReplacedRenewalIsNeverPostedAgainWithoutReplaces(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	iss := newIssuer(t, b.pool, nil, b.config())
	name := randomName("a")
	ctx := testCtx(t, 30*time.Second)
	first, err := iss.Issue(ctx, issuing.Request{Domain: name})
	require.NoError(t, err)
	_, err = iss.Issue(ctx, issuing.Request{Domain: name, CurrentPEM: first.ChainPEM})
	require.NoError(t, err)
	require.Equal(t, 2, b.ca.OrderRequests())

	_, err = iss.Issue(ctx, issuing.Request{Domain: name, CurrentPEM: first.ChainPEM})
	var refused *issuing.ReplacesRefusedError
	require.ErrorAs(t, err, &refused)
	require.Greater(t, refused.RetryAfter, time.Duration(0), "a long-lived certificate waits before it is tried again")
	require.LessOrEqual(t, refused.RetryAfter, time.Hour)
	require.Equal(t, 3, b.ca.OrderRequests(), "lego's second new order, without replaces, must not be sent")
	require.Len(t, b.ca.Orders(), 2)
}

// A renewal whose "replaces" the CA refuses waits while more than a third of the
// certificate's lifetime is left, asking again with "replaces"; once a third is
// left it goes without, admitted again by the ledger as a new order (Readmit).
func TestIssue_ARefusedRenewalGoesWithoutReplacesOnlyOnceAThirdIsLeft(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	iss := newIssuer(t, b.pool, nil, b.config())
	ctx := testCtx(t, 30*time.Second)
	readmits := 0
	readmit := func(context.Context) error { readmits++; return nil }

	// Two thirds and more left: refused, and still refused when asked again.
	young := issuing.Request{DomainID: uuid.NewString(), Domain: randomName("y"), Readmit: readmit,
		CurrentPEM: unknownCertificate(t, randomName("y"), time.Now().Add(-30*time.Minute), time.Now().Add(2*time.Hour))}
	for range 2 {
		_, err := iss.Issue(ctx, young)
		var refused *issuing.ReplacesRefusedError
		require.ErrorAs(t, err, &refused)
		require.Equal(t, time.Hour, refused.RetryAfter.Round(time.Minute))
	}
	require.Zero(t, readmits)
	require.Empty(t, b.ca.Orders())
	requests := b.ca.OrderRequests()
	require.Equal(t, 2, requests, "each try is one new-order request naming the certificate")

	// A third left: refused once, then ordered without "replaces".
	old := issuing.Request{DomainID: uuid.NewString(), Domain: randomName("o"), Readmit: readmit,
		CurrentPEM: unknownCertificate(t, randomName("o"), time.Now().Add(-90*time.Minute), time.Now().Add(30*time.Minute))}
	_, err := iss.Issue(ctx, old)
	var refused *issuing.ReplacesRefusedError
	require.ErrorAs(t, err, &refused)
	require.Zero(t, refused.RetryAfter, "a third is left already: at once, without replaces")
	require.Zero(t, readmits)
	cert, err := iss.Issue(ctx, old)
	require.NoError(t, err)
	require.NoError(t, parseChain(t, cert.ChainPEM)[0].VerifyHostname(old.Domain))
	require.Equal(t, 1, readmits, "the order without replaces is admitted again as a new one")
	orders := b.ca.Orders()
	require.Len(t, orders, 1)
	require.Empty(t, orders[0].Replaces)
	require.Equal(t, requests+2, b.ca.OrderRequests())
}

// An order whose instance went away after its finalize reached the CA is resumed by
// whoever takes the domain next: the certificate is fetched with the recorded key,
// from the order naming the certificate it replaces, and nothing is ordered again.
// Against a CA that answers as Boulder does, a new order would be refused
// (alreadyReplaced) and, sent without "replaces", lose the renewal's exemption.
func TestIssue_ARenewalAbandonedAfterItsFinalizeIsResumed(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	front := pebbletest.NewFront(t, b.ca)
	front.SetReplacesAsBoulder(true)
	cfg := frontConfig(b, front)
	name := randomName("h")
	ctx := testCtx(t, time.Minute)
	first, err := newIssuer(t, b.pool, nil, cfg).Issue(ctx, issuing.Request{Domain: name})
	require.NoError(t, err)

	hold := make(chan struct{})
	defer close(hold)
	front.Add(pebbletest.Rule{Step: pebbletest.StepFinalize, Times: 1, Answer: pebbletest.Answer{Hold: hold}})
	req := issuing.Request{DomainID: uuid.NewString(), Domain: name, CurrentPEM: first.ChainPEM}
	octx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := newIssuer(t, b.pool, nil, cfg).Issue(octx, req); done <- err }()
	require.Eventually(t, func() bool { return front.Holding() == 1 }, 30*time.Second, 5*time.Millisecond)
	var key *string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT key_pem FROM certworker_orders WHERE domain_id = $1`, req.DomainID).Scan(&key))
	require.NotNil(t, key, "the key is recorded before the finalize")
	cancel() // the instance goes away with the finalize's answer held
	require.ErrorIs(t, <-done, context.Canceled)

	renewed, err := newIssuer(t, b.pool, nil, cfg).Issue(ctx, req)
	require.NoError(t, err)
	require.NoError(t, parseChain(t, renewed.ChainPEM)[0].VerifyHostname(name))
	orders := b.ca.Orders()
	require.Len(t, orders, 2, "the renewal was resumed, not ordered again")
	wantID, err := certificate.MakeARICertID(parseChain(t, first.ChainPEM)[0])
	require.NoError(t, err)
	require.Equal(t, wantID, orders[1].Replaces)
	require.Len(t, b.ca.IssuedSerials(), 2, "one new certificate for the renewal")
	require.Equal(t, 2, b.ca.Requests()[pebbletest.StepFinalize], "one finalize for the first certificate, one for the renewal")
}

// A recorded order the CA has ended (its authorizations deactivated) is forgotten and
// a new one placed.
func TestIssue_ARecordedOrderTheCAEndedIsForgotten(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	front := pebbletest.NewFront(t, b.ca)
	cfg := frontConfig(b, front)
	name := randomName("f")
	ctx := testCtx(t, time.Minute)
	req := issuing.Request{DomainID: uuid.NewString(), Domain: name}
	// The challenge answered 500 once: the order fails after it was recorded, and its
	// pending authorization is deactivated.
	front.Add(pebbletest.Rule{Step: pebbletest.StepChallenge, Times: 1, Answer: pebbletest.Answer{Status: 500,
		Problem: &pebbletest.Problem{Type: "urn:ietf:params:acme:error:serverInternal", Detail: "down"}}})
	_, err := newIssuer(t, b.pool, nil, cfg).Issue(ctx, req)
	require.Error(t, err)
	var url string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT order_url FROM certworker_orders WHERE domain_id = $1`, req.DomainID).Scan(&url))
	require.Equal(t, b.ca.Orders()[0].URL, url, "the order is recorded right after the CA accepted it")

	cert, err := newIssuer(t, b.pool, nil, cfg).Issue(ctx, req)
	require.NoError(t, err)
	require.NoError(t, parseChain(t, cert.ChainPEM)[0].VerifyHostname(name))
	require.Len(t, b.ca.Orders(), 2, "an ended order is not resumed")
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT order_url FROM certworker_orders WHERE domain_id = $1`, req.DomainID).Scan(&url))
	require.Equal(t, b.ca.Orders()[1].URL, url)
}

// The finalize is sent only once the worker has confirmed the claim on the database
// (Request.ConfirmClaim): a claim confirmed lost stops the order with ErrClaimLost
// and the CA sees no finalize, so no certificate is issued that nobody stores.
func TestIssue_AClaimConfirmedLostSendsNoFinalize(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	iss := newIssuer(t, b.pool, nil, b.config())
	asked := 0
	_, err := iss.Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: randomName("l"),
		ConfirmClaim: func(context.Context) error { asked++; return issuing.ErrClaimLost }})
	require.ErrorIs(t, err, issuing.ErrClaimLost)
	require.Equal(t, 1, asked)
	require.Zero(t, b.ca.Requests()[pebbletest.StepFinalize])
	require.Len(t, b.ca.Orders(), 1)
	require.Empty(t, b.ca.IssuedSerials())
}

// unknownCertificate is a certificate for name from a CA nobody knows, valid from
// notBefore to notAfter, with an authority key id (so that it has an RFC 9773 id).
func unknownCertificate(t *testing.T, name string, notBefore, notAfter time.Time) string {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "unknown CA"},
		NotBefore: notBefore, NotAfter: notAfter.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, SubjectKeyId: []byte{1, 2, 3, 4}}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), DNSNames: []string{name},
		NotBefore: notBefore, NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &leafKey.PublicKey, caKey)
	require.NoError(t, err)
	var out strings.Builder
	require.NoError(t, pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: der}))
	require.NoError(t, pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: caDER}))
	return out.String()
}
