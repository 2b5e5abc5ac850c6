package certstore_test

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/certstore"
	"github.com/certworker/certworker/certstore/seal"
	"github.com/certworker/certworker/internal/pgtest"
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

// A load is one statement that reads through the index on lower(domain), in the
// generic plan pgx's prepared statement gets too, whether the name is served or not
// (a miss also counts the rows behind it, for the error): the function is inlined,
// and nothing scans a table. Guards against the proxy's handshakes each reading
// every domain row, which a million domains would not survive.
func TestStore_ALoadReadsThroughTheIndexOnTheLoweredName(t *testing.T) {
	t.Parallel()
	b := setup(t, certstore.Options{TTL: long, MissTTL: long})
	_, err := b.admin.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_provider, ssl_status)
SELECT $1, 'n' || i || '.bulk.example', 'verified', 'tok', 'acme', 'active' FROM generate_series(1, 20000) i`, b.tenant)
	require.NoError(t, err)
	_, err = b.admin.Exec(b.ctx, `INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem)
SELECT 'n' || i || '.bulk.example', 'chain', 'key' FROM generate_series(1, 20000) i`)
	require.NoError(t, err)
	conn, err := pgx.Connect(b.ctx, b.dsn)
	require.NoError(t, err)
	defer conn.Close(b.ctx)
	_, err = conn.Exec(b.ctx, `ANALYZE proxy_domains; ANALYZE proxy_certificates; SET plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	_, err = conn.Exec(b.ctx, `PREPARE load(text, bigint, text, text) AS `+certstore.LoadSQL)
	require.NoError(t, err)
	for _, args := range []string{
		`'n17.bulk.example', -1, '', '*.bulk.example'`,
		`'unknown.bulk.example', -1, '', '*.bulk.example'`,
	} {
		nodes := pgtest.PlanNodes(t, conn, `EXECUTE load(`+args+`)`)
		require.Contains(t, nodes, pgtest.PlanNode{NodeType: "Index Scan", RelationName: "proxy_domains", IndexName: "proxy_domains_lower_domain_idx"}, "%s: %v", args, nodes)
		for _, n := range nodes {
			require.NotEqual(t, "Function Scan", n.NodeType, "%s: the function was not inlined: %v", args, nodes)
			require.NotEqual(t, "Seq Scan", n.NodeType, "%s: %v", args, nodes)
		}
	}
}
