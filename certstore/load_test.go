package certstore_test

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/certstore"
	"github.com/certworker/certworker/certstore/seal"
)

// A certificate past its TTL is checked again, and when certworker_certificate_for
// still answers with the row and version held, the certificate and key are not sent
// again: the store keeps the very certificate it parsed (the same pointer), where a
// certificate sent again would be parsed into a new one. Guards against every TTL
// check of 100,000 cached names transferring and opening 100,000 keys.
func TestStore_ACheckOfAnUnchangedCertificateTransfersNoCertificate(t *testing.T) {
	t.Parallel()
	b := setup(t, certstore.Options{TTL: 50 * time.Millisecond, MissTTL: long})
	epoch := certstore.Epoch(b.store)
	c := b.served(t, "same.example")
	waitFor(t, 5*time.Second, "the insert's notification", func() bool { return certstore.Epoch(b.store) > epoch })
	b.requireServes(t, "same.example", c.serial)
	first, checked := certstore.Held(b.store, "same.example")
	require.NotNil(t, first)
	loads := b.loads.of("same.example")

	hello := &tls.ClientHelloInfo{ServerName: "same.example"}
	waitFor(t, 5*time.Second, "a check past the TTL", func() bool {
		got, err := b.store.GetCertificate(hello) // past the TTL: served, and checked in the background
		require.NoError(t, err)
		require.Same(t, first, got)
		_, next := certstore.Held(b.store, "same.example")
		return next.After(checked)
	})
	require.Greater(t, b.loads.of("same.example"), loads, "the certificate was not checked again")
	now, _ := certstore.Held(b.store, "same.example")
	require.Same(t, first, now, "the unchanged certificate was sent and parsed again")
}

// The store tells certificates apart by their row as well as their version. Rows
// nobody wrote since versions began all have version 0: a name served by such a
// wildcard that gets a verified row of its own, whose certificate also has none,
// is served its own certificate, not the wildcard's kept as "unchanged". Guards
// against the version alone deciding, which kept serving the wildcard's.
func TestStore_ANameMovedToAnotherRowIsServedItEvenAtTheSameVersion(t *testing.T) {
	t.Parallel()
	b := setup(t, certstore.Options{TTL: long, MissTTL: long})
	wild := b.served(t, "*.legacy.example")
	_, err := b.admin.Exec(b.ctx, `UPDATE proxy_certificates SET version = NULL WHERE domain = '*.legacy.example'`)
	require.NoError(t, err)
	b.requireServes(t, "www.legacy.example", wild.serial)

	epoch := certstore.Epoch(b.store)
	b.domain(t, "www.legacy.example", "pending", "acme", "pending")
	own := b.ca.valid(t, "www.legacy.example")
	b.storeCert(t, b.admin, "www.legacy.example", own)
	_, err = b.admin.Exec(b.ctx, `UPDATE proxy_certificates SET version = NULL WHERE domain = 'www.legacy.example'`)
	require.NoError(t, err)
	waitFor(t, 5*time.Second, "the certificate's notification", func() bool { return certstore.Epoch(b.store) > epoch })
	b.requireServes(t, "www.legacy.example", wild.serial) // its own row is not verified yet

	_, err = b.admin.Exec(b.ctx, `UPDATE proxy_domains SET verification_status = 'verified' WHERE domain = 'www.legacy.example'`)
	require.NoError(t, err)
	b.waitServes(t, "www.legacy.example", own.serial, 5*time.Second)
}

// The store serves what certworker_certificate_for answers, with the key sealed to
// the domain the function returns: a name below a wildcard stored in upper case
// opens the wildcard's key sealed to "*.base" in lower case, asked for in any case
// and with a trailing dot, and a case twin's certificate is served under the row
// that keeps the name. Guards against the store opening a key with the name asked
// for rather than the row's, which fails every name a wildcard serves.
func TestStore_OpensTheKeySealedToTheRowTheFunctionServes(t *testing.T) {
	t.Parallel()
	b := setup(t, certstore.Options{TTL: long, MissTTL: long, KeyEncryptionKeys: seal.Keyring{testKEK(3)}})
	b.domain(t, "*.Upper.example", "verified", "acme", "active")
	wild := b.ca.valid(t, "*.upper.example")
	b.storeCert(t, b.admin, "*.Upper.example", wild) // sealed to "*.upper.example"
	b.requireServes(t, "www.upper.example", wild.serial)
	b.requireServes(t, "API.Upper.Example.", wild.serial)

	b.domain(t, "kept.example", "verified", "acme", "pending")
	b.domain(t, "KEPT.example", "verified", "acme", "active")
	kept := b.ca.valid(t, "kept.example")
	b.storeCert(t, b.admin, "KEPT.example", kept) // the twin holding a certificate keeps the name
	b.requireServes(t, "kept.example", kept.serial)
}
