package certstore_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/certstore"
	"github.com/certworker/certworker/certstore/seal"
	"github.com/certworker/certworker/internal/pgtest"
)

// The tenant's path: a handshake before the certificate exists fails, and once the
// domain is verified and the worker has stored its certificate, the next handshake
// presents it. The miss is remembered for a minute here, so only the notification
// explains a certificate served within seconds. Guards against a store that keeps
// refusing a new domain until its miss expires.
func TestStore_ServesTheCertificateStoredAfterVerify(t *testing.T) {
	t.Parallel()
	b := setup(t, certstore.Options{TTL: long, MissTTL: time.Minute})
	b.domain(t, "shop.example", "pending", "acme", "pending")
	b.requireRefused(t, "shop.example", certstore.ErrNotVerified)

	_, err := b.admin.Exec(b.ctx, `UPDATE proxy_domains SET verification_status = 'verified' WHERE domain = 'shop.example'`)
	require.NoError(t, err)
	b.requireRefused(t, "shop.example", certstore.ErrNotVerified) // the miss is remembered

	// The worker stores the certificate and turns the domain active in one
	// transaction, as queue.MarkActive does.
	c := b.ca.valid(t, "shop.example")
	require.NoError(t, pgx.BeginFunc(b.ctx, b.admin, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `UPDATE proxy_domains SET ssl_status = 'active' WHERE domain = 'shop.example'`); err != nil {
			return err
		}
		b.storeCert(t, tx, "shop.example", c)
		return nil
	}))
	b.waitServes(t, "shop.example", c.serial, 5*time.Second)
}

// A renewal replaces the row; the next handshakes present the new serial without
// waiting for the TTL. Guards against a proxy serving the old certificate until it
// expires.
func TestStore_RenewalPresentsTheNewSerial(t *testing.T) {
	t.Parallel()
	b := setup(t, certstore.Options{TTL: long, MissTTL: long})
	old := b.served(t, "renew.example")
	b.requireServes(t, "renew.example", old.serial)

	renewed := b.ca.valid(t, "renew.example")
	b.storeCert(t, b.admin, "renew.example", renewed)
	b.waitServes(t, "renew.example", renewed.serial, 5*time.Second)
	b.requireServes(t, "renew.example", renewed.serial)
}

// An operator replaces a certificate with one that is older (earlier dates, still
// valid): it is served, because the row's version, not the certificate's dates, says
// which is newer. Guards against "keep the later notAfter" logic that would ignore
// an operator's rollback.
func TestStore_ReplacementJudgedByVersionNotDates(t *testing.T) {
	t.Parallel()
	b := setup(t, certstore.Options{TTL: long, MissTTL: long})
	current := b.served(t, "rollback.example")
	b.requireServes(t, "rollback.example", current.serial)

	older := b.ca.issue(t, "rollback.example", time.Now().Add(-60*24*time.Hour), time.Now().Add(10*24*time.Hour))
	require.True(t, older.notAfter.Before(current.notAfter))
	b.storeCert(t, b.admin, "rollback.example", older)
	b.waitServes(t, "rollback.example", older.serial, 5*time.Second)
}

// A verified domain with a valid certificate is served whatever its ssl_status and
// provider: a renewal under way, a failed renewal, a manual upload (with a PEM key
// and a name stored in upper case). Guards against a proxy going dark because a
// renewal failed, or against manual uploads never being served.
func TestStore_ServesVerifiedDomainsWhateverTheirStatusAndProvider(t *testing.T) {
	t.Parallel()
	b := setup(t, certstore.Options{TTL: long, MissTTL: long, KeyEncryptionKeys: seal.Keyring{testKEK(1)}})
	for _, tc := range []struct{ name, provider, status string }{
		{"provisioning.example", "acme", "provisioning"},
		{"failed.example", "acme", "failed"},
		{"pending.example", "acme", "pending"},
		{"manual.example", "manual", "active"},
		{"none.example", "none", "pending"},
		{"Upper.Example", "manual", "active"},
	} {
		b.domain(t, tc.name, "verified", tc.provider, tc.status)
		c := b.ca.valid(t, strings.ToLower(tc.name))
		if tc.provider == "manual" {
			b.storeRaw(t, b.admin, tc.name, c.chainPEM, c.keyPEM, c) // uploaded as PEM
		} else {
			b.storeCert(t, b.admin, tc.name, c)
		}
		b.requireServes(t, strings.ToLower(tc.name), c.serial)
	}
	c := b.served(t, "case.example")
	b.requireServes(t, "CASE.example.", c.serial) // SNI in any case, with a trailing dot
}

// Every name the store must not serve fails the handshake, with the reason, and
// never presents another certificate. Guards against a fallback certificate (another
// tenant's) and against serving a domain that is not, or no longer, verified.
func TestStore_RefusesWhatItMustNotServe(t *testing.T) {
	t.Parallel()
	keys := seal.Keyring{testKEK(1)}
	b := setup(t, certstore.Options{TTL: long, MissTTL: long, KeyEncryptionKeys: keys})
	b.served(t, "other-tenant.example") // served, and never to anyone else

	b.domain(t, "unverified.example", "pending", "acme", "active")
	b.storeCert(t, b.admin, "unverified.example", b.ca.valid(t, "unverified.example"))
	b.domain(t, "failed-verification.example", "failed", "manual", "active")
	b.storeCert(t, b.admin, "failed-verification.example", b.ca.valid(t, "failed-verification.example"))
	b.domain(t, "nocert.example", "verified", "acme", "pending")
	b.domain(t, "expired.example", "verified", "acme", "active")
	b.storeCert(t, b.admin, "expired.example", b.ca.issue(t, "expired.example", time.Now().Add(-90*24*time.Hour), time.Now().Add(-time.Hour)))
	b.domain(t, "future.example", "verified", "acme", "active")
	b.storeCert(t, b.admin, "future.example", b.ca.issue(t, "future.example", time.Now().Add(time.Hour), time.Now().Add(90*24*time.Hour)))
	b.domain(t, "mismatch.example", "verified", "manual", "active")
	b.storeCert(t, b.admin, "mismatch.example", b.ca.valid(t, "other-tenant.example"))
	b.domain(t, "otherkey.example", "verified", "acme", "active")
	c := b.ca.valid(t, "otherkey.example")
	sealedElsewhere, err := seal.Keyring{testKEK(9)}.Seal([]byte(c.keyPEM), "otherkey.example")
	require.NoError(t, err)
	b.storeRaw(t, b.admin, "otherkey.example", c.chainPEM, sealedElsewhere, c)
	// Two verified uploads of one name in two cases, neither from ACME: either could
	// be another tenant's (of acme twins, the rule of certworker_certificate_for serves one:
	// TestStore_ACaseTwinThatDoesNotKeepTheNameStopsNothing).
	b.domain(t, "twice.example", "verified", "manual", "active")
	b.domain(t, "TWICE.example", "verified", "manual", "active")
	b.storeCert(t, b.admin, "twice.example", b.ca.valid(t, "twice.example"))

	for name, want := range map[string]error{
		"unknown.example":             certstore.ErrUnknownName,
		"twice.example":               certstore.ErrUnknownName,
		"unverified.example":          certstore.ErrNotVerified,
		"failed-verification.example": certstore.ErrNotVerified,
		"nocert.example":              certstore.ErrNoCertificate,
		"expired.example":             certstore.ErrUnusable,
		"future.example":              certstore.ErrUnusable,
		"mismatch.example":            certstore.ErrUnusable,
		"otherkey.example":            certstore.ErrUnusable,
		"localhost":                   certstore.ErrNoServerName,
		"bad_name!.example":           certstore.ErrNoServerName,
	} {
		b.requireRefused(t, name, want)
	}
	// A hello without SNI at all.
	_, err = b.store.GetCertificate(&tls.ClientHelloInfo{})
	require.ErrorIs(t, err, certstore.ErrNoServerName)
}

// A verified domain that is unverified or deleted, and a certificate that is
// deleted, stop being served at once (the domain trigger and the certificate
// trigger notify), not when the TTL runs out. Guards against a proxy serving a
// domain its tenant has lost.
func TestStore_WithdrawnDomainOrCertificateStopsAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, certstore.Options{TTL: long, MissTTL: long})
	for _, name := range []string{"unverify.example", "delete-domain.example", "delete-cert.example"} {
		c := b.served(t, name)
		b.requireServes(t, name, c.serial)
	}
	_, err := b.admin.Exec(b.ctx, `UPDATE proxy_domains SET verification_status = 'failed' WHERE domain = 'unverify.example'`)
	require.NoError(t, err)
	_, err = b.admin.Exec(b.ctx, `DELETE FROM proxy_domains WHERE domain = 'delete-domain.example'`)
	require.NoError(t, err)
	_, err = b.admin.Exec(b.ctx, `DELETE FROM proxy_certificates WHERE domain = 'delete-cert.example'`)
	require.NoError(t, err)
	b.waitRefused(t, "unverify.example", certstore.ErrNotVerified, 5*time.Second)
	b.waitRefused(t, "delete-domain.example", certstore.ErrUnknownName, 5*time.Second)
	b.waitRefused(t, "delete-cert.example", certstore.ErrNoCertificate, 5*time.Second)
}

// Keys sealed in every format a database may hold during a rotation open: v2 under
// the new key, v2 and v1 under the old one, and PEM. Guards against a proxy that
// loses every certificate sealed before the rotation.
func TestStore_OpensKeysSealedUnderAnyGivenKey(t *testing.T) {
	t.Parallel()
	oldKey, newKey := testKEK(1), testKEK(2)
	b := setup(t, certstore.Options{TTL: long, MissTTL: long, KeyEncryptionKeys: seal.Keyring{newKey, oldKey}})
	for name, sealWith := range map[string]func(c issued, aad string) string{
		"v2-new.example": func(c issued, aad string) string { s, _ := seal.Keyring{newKey}.Seal([]byte(c.keyPEM), aad); return s },
		"v2-old.example": func(c issued, aad string) string { s, _ := seal.Keyring{oldKey}.Seal([]byte(c.keyPEM), aad); return s },
		"v1-old.example": func(c issued, aad string) string { return sealV1(t, oldKey, []byte(c.keyPEM), aad) },
		"pem.example":    func(c issued, _ string) string { return c.keyPEM },
	} {
		b.domain(t, name, "verified", "acme", "active")
		c := b.ca.valid(t, name)
		b.storeRaw(t, b.admin, name, c.chainPEM, sealWith(c, name), c)
		b.requireServes(t, name, c.serial)
	}
}

// A flood of handshakes for unknown names, or for one name not yet loaded, costs one
// query per name, and a hello with no usable name costs none. Guards against a
// scanner sending random SNI turning every handshake into a query on the proxy's
// database.
func TestStore_MissFloodCostsBoundedQueries(t *testing.T) {
	t.Parallel()
	b := setup(t, certstore.Options{TTL: long, MissTTL: time.Minute})
	epoch := certstore.Epoch(b.store)
	c := b.served(t, "popular.example")
	// Its notification could otherwise arrive during the flood and rightly cost a
	// reload.
	waitFor(t, 5*time.Second, "the insert's notification", func() bool { return certstore.Epoch(b.store) > epoch })
	const names, rounds, workers = 10, 40, 25
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				name := fmt.Sprintf("unknown-%d.example", (w+i)%names)
				if i%4 == 0 {
					name = "popular.example"
				}
				_, _ = b.store.GetCertificate(&tls.ClientHelloInfo{ServerName: name})
				_, _ = b.store.GetCertificate(&tls.ClientHelloInfo{ServerName: "not a name"})
			}
		}()
	}
	wg.Wait()
	require.LessOrEqual(t, b.loads.total(), int64(names+1),
		"%d handshakes for %d unknown names and one known one", workers*rounds, names)
	b.requireServes(t, "popular.example", c.serial)
	b.requireRefused(t, "unknown-3.example", certstore.ErrUnknownName)
	require.LessOrEqual(t, b.loads.total(), int64(names+1), "real handshakes were answered from memory")
}

// The cap on remembered misses holds under random names, and what it evicts is only
// asked again. Guards against random SNI growing the proxy's memory without bound.
func TestStore_MissesAreCapped(t *testing.T) {
	t.Parallel()
	b := setup(t, certstore.Options{TTL: long, MissTTL: long, MaxMisses: 50})
	for i := range 500 {
		_, err := b.store.GetCertificate(&tls.ClientHelloInfo{ServerName: fmt.Sprintf("r%d.example", i)})
		require.ErrorIs(t, err, certstore.ErrUnknownName)
	}
	require.LessOrEqual(t, certstore.Misses(b.store), 50)
}

// With PostgreSQL stopped, names already served keep completing handshakes, past
// their TTL too; a name never loaded fails with ErrUnavailable; and when the server
// is back the store listens again and serves a renewal. Guards against an outage
// of the database taking every tenant's HTTPS down with it.
func TestStore_KeepsServingWhilePostgresIsDown(t *testing.T) {
	t.Parallel()
	server := pgtest.StartServer(t)
	b := setup(t, certstore.Options{TTL: 200 * time.Millisecond, MissTTL: time.Minute,
		LoadTimeout: 2 * time.Second, BackoffMin: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond}, server)
	a := b.served(t, "a.example")
	c := b.served(t, "b.example")
	b.domain(t, "later.example", "verified", "acme", "active")
	b.requireServes(t, "a.example", a.serial)
	b.requireServes(t, "b.example", c.serial)

	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Minute)
	defer cancel()
	require.NoError(t, server.Stop(ctx))
	waitFor(t, 10*time.Second, "the store to see the database gone", func() bool { return !b.store.Connected() })
	for range 3 {
		b.requireServes(t, "a.example", a.serial)
		b.requireServes(t, "b.example", c.serial)
		time.Sleep(250 * time.Millisecond) // past the TTL: each round reloads, and fails
	}
	b.requireRefused(t, "later.example", certstore.ErrUnavailable)

	require.NoError(t, server.Start(ctx))
	waitFor(t, 30*time.Second, "the store to listen again", b.store.Connected)
	admin, err := pgxpool.New(b.ctx, b.dsn)
	require.NoError(t, err)
	defer admin.Close()
	renewed := b.ca.valid(t, "a.example")
	b.storeCert(t, admin, "a.example", renewed)
	b.waitServes(t, "a.example", renewed.serial, 10*time.Second)
}

// Notifications sent while the store's connection was down are lost; after it
// reconnects, it compares versions and serves what changed meanwhile, without
// waiting for the TTL, and reloads nothing else (a name a wildcard serves included).
// Guards against a proxy serving a replaced certificate for the rest of the TTL
// after a network blip.
func TestStore_RechecksWhatItHoldsAfterReconnecting(t *testing.T) {
	t.Parallel()
	b := setup(t, certstore.Options{TTL: long, MissTTL: long, BackoffMin: 3 * time.Second, BackoffMax: 3 * time.Second})
	epoch := certstore.Epoch(b.store)
	wild := b.served(t, "*.same.example") // its notification comes first: no name it serves is held yet
	changed := b.served(t, "changed.example")
	same := b.served(t, "same.example")
	gone := b.served(t, "gone.example")
	waitFor(t, 5*time.Second, "the inserts' notifications", func() bool { return certstore.Epoch(b.store) >= epoch+3 })
	for name, c := range map[string]issued{"changed.example": changed, "same.example": same, "gone.example": gone, "www.same.example": wild} {
		b.requireServes(t, name, c.serial)
	}
	sameLoads, wildLoads := b.loads.of("same.example"), b.loads.of("www.same.example")

	// Cut every connection of the store's, and keep it from connecting again until
	// the changes are made (on a loaded machine they took longer than the listener's
	// 1.5 to 3 s backoff, and it was back for them).
	b.offline.Store(true)
	_, err := b.admin.Exec(b.ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND usename = current_user`)
	require.NoError(t, err)
	waitFor(t, 5*time.Second, "the listener to notice", func() bool { return !b.store.Connected() })
	admin, err := pgxpool.New(b.ctx, b.dsn) // b.admin's connections were cut too
	require.NoError(t, err)
	defer admin.Close()
	renewed := b.ca.valid(t, "changed.example")
	b.storeCert(t, admin, "changed.example", renewed)
	_, err = admin.Exec(b.ctx, `DELETE FROM proxy_certificates WHERE domain = 'gone.example'`)
	require.NoError(t, err)
	require.False(t, b.store.Connected(), "the changes must be made while the listener is away")
	b.requireServes(t, "changed.example", changed.serial) // the notification was lost
	b.offline.Store(false)

	waitFor(t, 10*time.Second, "the listener to reconnect", b.store.Connected)
	b.waitServes(t, "changed.example", renewed.serial, 5*time.Second)
	b.waitRefused(t, "gone.example", certstore.ErrNoCertificate, 5*time.Second)
	b.requireServes(t, "same.example", same.serial)
	b.requireServes(t, "www.same.example", wild.serial)
	require.Equal(t, sameLoads, b.loads.of("same.example"), "only what changed is reloaded")
	require.Equal(t, wildLoads, b.loads.of("www.same.example"), "a name served by an unchanged wildcard was reloaded")
}

// Open fails at once when the database cannot be reached, and Close is safe twice.
// Guards against a proxy starting with a bad connection string and serving nothing.
func TestStore_OpenFailsFastAndCloseIsIdempotent(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://x:y@127.0.0.1:1/none?connect_timeout=2")
	require.NoError(t, err)
	defer pool.Close()
	_, err = certstore.Open(context.Background(), pool, certstore.Options{})
	require.ErrorContains(t, err, "connect")

	_, err = certstore.Open(context.Background(), pool, certstore.Options{KeyEncryptionKeys: seal.Keyring{make([]byte, 16)}})
	require.ErrorContains(t, err, "--key-encryption-key")

	b := setup(t, certstore.Options{})
	b.store.Close()
	b.store.Close()
	require.False(t, b.store.Connected())
}

// Case twins: another tenant's row of the same name in another case, unverified or
// not acme, never stops the verified row's certificate being served, and a verified
// acme twin that lost the name is not served in its place. Guards against the rule of
// old ("two rows in different case: serve neither"), under which any tenant could take
// a name off the air by adding it in capitals.
func TestStore_ACaseTwinThatDoesNotKeepTheNameStopsNothing(t *testing.T) {
	t.Parallel()
	for _, twin := range []struct{ verification, provider, status string }{
		{"pending", "none", "pending"},
		{"verified", "manual", "active"},
		{"verified", "acme", "pending"},
	} {
		t.Run(twin.verification+" "+twin.provider, func(t *testing.T) {
			t.Parallel()
			b := setup(t, certstore.Options{TTL: long, MissTTL: long})
			c := b.served(t, "twin.example")
			var other string
			require.NoError(t, b.admin.QueryRow(b.ctx, `INSERT INTO proxy_tenants (name, slug, email)
VALUES ('other', 'other-twin', 'o@example.com') RETURNING id::text`).Scan(&other))
			_, err := b.admin.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_provider, ssl_status)
VALUES ($1, 'TWIN.EXAMPLE', $2, 'tok', $3, $4)`, other, twin.verification, twin.provider, twin.status)
			require.NoError(t, err)
			b.requireServes(t, "twin.example", c.serial)
		})
	}
}
