package queue_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// sslRow is a domain's SSL state and claim columns, as stored.
type sslRow struct {
	Status      string
	Attempts    int
	Error       *string
	LastAttempt *time.Time
	ExpiresAt   *time.Time
	Token       *string
	ClaimedBy   *string
	Lease       *time.Time
}

func (b *bundle) sslRow(t *testing.T, id string) sslRow {
	t.Helper()
	var r sslRow
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT ssl_status, ssl_attempts, ssl_error, ssl_last_attempt_at, ssl_expires_at,
    ssl_claim_token::text, ssl_claimed_by, ssl_lease_expires_at
FROM proxy_domains WHERE id = $1`, id).Scan(&r.Status, &r.Attempts, &r.Error, &r.LastAttempt,
		&r.ExpiresAt, &r.Token, &r.ClaimedBy, &r.Lease))
	return r
}

// storedCert is a proxy_certificates row.
type storedCert struct {
	ChainPEM   string
	PrivateKey string
	ExpiresAt  time.Time
	NotBefore  *time.Time
	Issuer     *string
	Serial     *string
	RenewAt    *time.Time
	AutoRenew  bool
}

// certRows returns the certificate rows stored for domain (there must be at most one).
func (b *bundle) certRows(t *testing.T, domain string) []storedCert {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `
SELECT certificate_pem, private_key_pem, expires_at, not_before, issuer, serial, renew_at, auto_renew
FROM proxy_certificates WHERE domain = $1`, domain)
	require.NoError(t, err)
	defer rows.Close()
	var out []storedCert
	for rows.Next() {
		var c storedCert
		require.NoError(t, rows.Scan(&c.ChainPEM, &c.PrivateKey, &c.ExpiresAt, &c.NotBefore,
			&c.Issuer, &c.Serial, &c.RenewAt, &c.AutoRenew))
		out = append(out, c)
	}
	require.NoError(t, rows.Err())
	return out
}

// mintPEM is a self-signed certificate for name, valid from notBefore to notAfter, in
// PEM, and its parsed form. x509 validity has whole seconds, so callers pass times
// truncated to the second.
func mintPEM(t *testing.T, name string, notBefore, notAfter time.Time) (string, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 64))
	require.NoError(t, err)
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "certworker test " + name},
		DNSNames:     []string{name},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
	}, &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "certworker test " + name},
	}, &key.PublicKey, key)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), leaf
}

// mintCertificate is what an issuer without ARI hands back for name: a certificate
// valid from notBefore to notAfter, renewed by RenewAtFromValidity.
func mintCertificate(t *testing.T, name string, notBefore, notAfter time.Time) *issuing.Certificate {
	t.Helper()
	chain, leaf := mintPEM(t, name, notBefore, notAfter)
	return &issuing.Certificate{
		ChainPEM:   chain,
		PrivateKey: "-----BEGIN PRIVATE KEY-----\nnot a real key " + uuid.NewString() + "\n-----END PRIVATE KEY-----\n",
		NotBefore:  leaf.NotBefore,
		NotAfter:   leaf.NotAfter,
		Issuer:     leaf.Issuer.String(),
		Serial:     leaf.SerialNumber.Text(16),
		RenewAt:    issuing.RenewAtFromValidity(leaf.NotBefore, leaf.NotAfter),
	}
}

// nowSecond is the current time truncated to the second, for certificate validity.
func nowSecond() time.Time { return time.Now().Truncate(time.Second) }

// Success writes the certificate and the domain's state together, and clears
// everything the failures before it left behind. A stale ssl_error on an active
// domain sends operators chasing a fixed problem; leftover attempts make the next
// renewal failure start high on the backoff curve; a leftover claim token lets a late
// write from the old claim overwrite the active row.
func TestMarkActive_StoresTheCertificateAndTurnsTheDomainActive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t), "pending", 3, ago(3600))
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_error = 'earlier failure' WHERE id = $1`, id)
	require.NoError(t, err)
	c := b.claimOne(t, id)
	now := nowSecond()
	cert := mintCertificate(t, name, now.Add(-time.Hour), now.Add(90*24*time.Hour))

	require.NoError(t, b.markActive(c, cert))

	r := b.sslRow(t, id)
	require.Equal(t, "active", r.Status)
	require.NotNil(t, r.ExpiresAt)
	require.True(t, cert.NotAfter.Equal(*r.ExpiresAt), "ssl_expires_at %s, want %s", r.ExpiresAt, cert.NotAfter)
	require.Zero(t, r.Attempts, "the failures before a success must not count against the next renewal")
	require.Nil(t, r.Error, "a stale error on an active domain")
	require.Nil(t, r.Token, "claim token left on an active row")
	require.Nil(t, r.ClaimedBy)
	require.Nil(t, r.Lease)

	certs := b.certRows(t, name)
	require.Len(t, certs, 1)
	got := certs[0]
	require.Equal(t, cert.ChainPEM, got.ChainPEM)
	require.Equal(t, cert.PrivateKey, got.PrivateKey)
	require.True(t, cert.NotAfter.Equal(got.ExpiresAt))
	require.NotNil(t, got.NotBefore)
	require.True(t, cert.NotBefore.Equal(*got.NotBefore))
	require.Equal(t, cert.Issuer, *got.Issuer)
	require.Equal(t, cert.Serial, *got.Serial)
	require.NotNil(t, got.RenewAt)
	require.True(t, cert.RenewAt.Equal(*got.RenewAt), "renew_at %s, want %s", got.RenewAt, cert.RenewAt)
	require.True(t, got.AutoRenew, "a new certificate row must renew by default")
}

// An instance that lost its claim (its lease ran out and another instance took the
// domain) must not store its certificate: the proxy would serve a certificate and key
// the row's current owner knows nothing about, and the owner's own result would then
// silently replace it.
func TestMarkActive_WithALostClaimWritesNoCertificate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t), "pending", 0, nil)
	c := b.claimOne(t, id)
	stale := c
	stale.Token = uuid.NewString()
	now := nowSecond()

	err := b.markActive(stale, mintCertificate(t, name, now, now.Add(90*24*time.Hour)))
	require.ErrorIs(t, err, issuing.ErrClaimLost)

	require.Empty(t, b.certRows(t, name), "a certificate was stored by a claim that no longer holds the row")
	r := b.sslRow(t, id)
	require.Equal(t, "provisioning", r.Status)
	require.NotNil(t, r.Token)
	require.Equal(t, c.Token, *r.Token, "the current claim was disturbed")
}

// The certificate and the domain's state are one transaction: when the certificate
// cannot be stored, the domain must not be left 'active' with no certificate (the
// proxy would serve nothing, and nothing would ever order one again), nor lose its
// claim. PostgreSQL refuses a NUL byte in text, which makes the insert fail after the
// domain's update has succeeded.
func TestMarkActive_ACertificateThatCannotBeStoredLeavesTheDomainUntouched(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t), "pending", 0, nil)
	c := b.claimOne(t, id)
	now := nowSecond()
	bad := mintCertificate(t, name, now, now.Add(90*24*time.Hour))
	bad.ChainPEM += "\x00"

	err := b.markActive(c, bad)
	// The failure must be the certificate's, after the domain's update succeeded, or
	// this test proves nothing about the transaction.
	require.ErrorContains(t, err, "store certificate")
	require.NotErrorIs(t, err, issuing.ErrClaimLost)

	require.Empty(t, b.certRows(t, name))
	r := b.sslRow(t, id)
	require.Equal(t, "provisioning", r.Status, "the domain's update was committed without its certificate")
	require.Nil(t, r.ExpiresAt)
	require.NotNil(t, r.Token)
	require.Equal(t, c.Token, *r.Token, "the claim was dropped although nothing was stored")

	// The claim still holds, so the order's retry of the write succeeds.
	require.NoError(t, b.markActive(c, mintCertificate(t, name, now, now.Add(90*24*time.Hour))))
	require.Equal(t, "active", b.status(t, id))
}

// A renewal replaces the stored certificate in place (one row per domain, a unique
// column): an insert would fail on the second issuance, and the domain would never
// leave 'provisioning'. auto_renew belongs to the proxy: a tenant who turned renewal
// off must not have it turned back on by the worker's next write.
func TestMarkActive_ASecondIssuanceReplacesTheCertificateAndKeepsAutoRenew(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t), "pending", 0, nil)
	now := nowSecond()
	first := mintCertificate(t, name, now.Add(-time.Hour), now.Add(6*24*time.Hour))
	require.NoError(t, b.markActive(b.claimOne(t, id), first))
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_certificates SET auto_renew = false WHERE domain = $1`, name)
	require.NoError(t, err)

	// The proxy asks for a new certificate anyway (say, after a key compromise).
	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_status = 'pending', ssl_last_attempt_at = NULL WHERE id = $1`, id)
	require.NoError(t, err)
	second := mintCertificate(t, name, now, now.Add(90*24*time.Hour))
	require.NoError(t, b.markActive(b.claimOne(t, id), second))

	certs := b.certRows(t, name)
	require.Len(t, certs, 1, "a second issuance must replace the row, not add one")
	got := certs[0]
	require.Equal(t, second.ChainPEM, got.ChainPEM, "the chain was not replaced")
	require.Equal(t, second.PrivateKey, got.PrivateKey, "the key was not replaced with its chain")
	require.Equal(t, second.Serial, *got.Serial)
	require.True(t, second.NotAfter.Equal(got.ExpiresAt))
	require.True(t, second.RenewAt.Equal(*got.RenewAt), "the renewal time was not moved to the new certificate's")
	require.False(t, got.AutoRenew, "the worker turned the proxy's auto_renew=false back on")
	r := b.sslRow(t, id)
	require.Equal(t, "active", r.Status)
	require.True(t, second.NotAfter.Equal(*r.ExpiresAt))
}

// A failure below the limit goes back to 'pending' with the backoff the claim query
// will apply: the worker sets its timer from RetryIn, so a RetryIn that disagrees
// with the SQL curve wakes the worker when nothing is due, or late.
func TestMarkFailed_GoesBackToPendingWithTheBackoff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "pending", 2, ago(3600))
	c := b.claimOne(t, id)

	f, err := b.q.MarkFailed(b.ctx, c, "dns problem: NXDOMAIN")
	require.NoError(t, err)
	require.Equal(t, 3, f.Attempts)
	require.False(t, f.GaveUp)
	// The rest of the backoff, on the database's clock: the claim was a moment ago.
	require.InDelta(t, b.q.Config().Backoff(3).Seconds(), f.RetryIn.Seconds(), 1)

	r := b.sslRow(t, id)
	require.Equal(t, "pending", r.Status)
	require.Equal(t, 3, r.Attempts)
	require.NotNil(t, r.Error)
	require.Equal(t, "dns problem: NXDOMAIN", *r.Error)
	require.NotNil(t, r.LastAttempt)
	require.True(t, c.ClaimedAt.Equal(*r.LastAttempt), "the backoff must run from the claim")
	require.Nil(t, r.Token, "claim token left on a pending row")
	require.Nil(t, r.ClaimedBy)
	require.Nil(t, r.Lease)
	require.False(t, b.claimsInclude(t, id), "a domain that just failed was retried inside its backoff")
}

// At the limit the domain is 'failed', where nothing picks it up until someone
// retries it, and the error says why; left 'pending' it would be neither retried nor
// shown as failed.
func TestMarkFailed_GivesUpAtTheLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "pending", 9, ago(5*60*60))
	c := b.claimOne(t, id)

	f, err := b.q.MarkFailed(b.ctx, c, "unauthorized: 404 for the challenge")
	require.NoError(t, err)
	require.Equal(t, issuing.Failure{Attempts: 10, GaveUp: true, RetryIn: 0}, f)

	r := b.sslRow(t, id)
	require.Equal(t, "failed", r.Status)
	require.Equal(t, 10, r.Attempts)
	require.NotNil(t, r.Error, "a failed domain must say why")
	require.Equal(t, "unauthorized: 404 for the challenge", *r.Error)
	require.Nil(t, r.Token)
	require.Nil(t, r.Lease)
	require.False(t, b.claimsInclude(t, id))
}

// The limit comes from --max-attempts, not from the default.
func TestMarkFailed_GivesUpAtTheConfiguredLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := issuing.DefaultConfig()
	cfg.MaxAttempts = 2
	q := queue.New(b.pool, cfg)
	tn := b.tenant(t)
	first, _ := b.domain(t, tn, "pending", 0, nil)
	second, _ := b.domain(t, tn, "pending", 1, ago(3600))
	claims, err := q.Claim(b.ctx, "test", testDirectory, 10)
	require.NoError(t, err)
	require.Len(t, claims, 2)
	for _, c := range claims {
		f, err := q.MarkFailed(b.ctx, c, "boom")
		require.NoError(t, err)
		require.Equal(t, c.ID == second, f.GaveUp, "attempts before %d, after %d", c.Attempts, f.Attempts)
	}
	require.Equal(t, "pending", b.status(t, first))
	require.Equal(t, "failed", b.status(t, second), "MaxAttempts 2 did not give up after the second failure")
}

// A hand-edited row can hold a negative count. It must count as 0, so the failure
// leaves 1 (not -4, which would buy the domain extra attempts, nor an overflow at the
// int4 minimum).
func TestMarkFailed_NegativeAttemptsCountAsZero(t *testing.T) {
	t.Parallel()
	for _, attempts := range []int{-1, -5, -2147483648} {
		t.Run(fmt.Sprint(attempts), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			id, _ := b.domain(t, b.tenant(t), "pending", attempts, ago(3600))
			c := b.claimOne(t, id)
			f, err := b.q.MarkFailed(b.ctx, c, "boom")
			require.NoError(t, err)
			require.Equal(t, 1, f.Attempts)
			require.False(t, f.GaveUp)
			require.InDelta(t, b.q.Config().Backoff(1).Seconds(), f.RetryIn.Seconds(), 1)
			r := b.sslRow(t, id)
			require.Equal(t, 1, r.Attempts)
			require.Equal(t, "pending", r.Status)
		})
	}
}

// A late result from an instance whose claim was taken over must be dropped, and say
// so: otherwise the old instance records a failure (an attempt, a backoff, perhaps
// 'failed') over an order another instance is running right now.
func TestMarkFailed_WithAStaleTokenReturnsErrClaimLostAndChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "pending", 0, nil)
	old := b.claimOne(t, id)
	// Its lease runs out, another pass requeues the row, another instance claims it.
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_lease_expires_at = now() - interval '1 second' WHERE id = $1`, id)
	require.NoError(t, err)
	_, err = b.q.ReclaimAbandoned(b.ctx)
	require.NoError(t, err)
	current := b.claimOne(t, id)
	before := b.sslRow(t, id)

	_, err = b.q.MarkFailed(b.ctx, old, "late failure")
	require.ErrorIs(t, err, issuing.ErrClaimLost)
	require.Equal(t, before, b.sslRow(t, id), "a stale claim changed the row")

	// A token that never held the row at all, likewise.
	wrong := current
	wrong.Token = uuid.NewString()
	_, err = b.q.MarkFailed(b.ctx, wrong, "wrong token")
	require.ErrorIs(t, err, issuing.ErrClaimLost)
	require.Equal(t, before, b.sslRow(t, id), "a wrong token changed the row")

	// The current claim is unaffected.
	_, err = b.q.MarkFailed(b.ctx, current, "real failure")
	require.NoError(t, err)
}

// A name no CA can issue for fails at once, whatever its attempts: retrying it ten
// times over a day would change nothing and tell the operator nothing.
func TestMarkInvalid_FailsTheDomainAtOnceWithTheReason(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "pending", 0, nil)
	c := b.claimOne(t, id)
	reason := issuing.InvalidDomainPrefix + "trailing dot"

	require.NoError(t, b.q.MarkPermanent(b.ctx, c, reason))

	r := b.sslRow(t, id)
	require.Equal(t, "failed", r.Status)
	require.NotNil(t, r.Error)
	require.Equal(t, reason, *r.Error)
	require.Nil(t, r.Token)
	require.Nil(t, r.ClaimedBy)
	require.Nil(t, r.Lease)
	require.False(t, b.claimsInclude(t, id))

	// And a stale claim cannot fail someone else's order.
	require.ErrorIs(t, b.q.MarkPermanent(b.ctx, c, reason), issuing.ErrClaimLost)
}

// A hand-back (shutdown, CA rate limit) costs the domain nothing: no attempt, and
// ssl_last_attempt_at restored, so it is claimable at once by any instance. Leaving
// the claim's stamp in place would push a domain that had waited out its backoff back
// into a fresh one for a failure that was not its own.
func TestRelease_HandsTheClaimBackUncharged(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		attempts int
		secsAgo  *int
	}{
		{"never tried", 0, nil},
		{"backoff elapsed", 3, ago(3600)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			id, _ := b.domain(t, b.tenant(t), "pending", tc.attempts, tc.secsAgo)
			before := b.sslRow(t, id)
			c := b.claimOne(t, id)

			require.NoError(t, b.q.Release(b.ctx, c, false))

			r := b.sslRow(t, id)
			require.Equal(t, "pending", r.Status)
			require.Equal(t, tc.attempts, r.Attempts, "a hand-back was charged to the domain")
			if before.LastAttempt == nil {
				require.Nil(t, r.LastAttempt, "ssl_last_attempt_at not restored")
			} else {
				require.NotNil(t, r.LastAttempt)
				require.True(t, before.LastAttempt.Equal(*r.LastAttempt),
					"ssl_last_attempt_at %s, want the pre-claim %s", r.LastAttempt, before.LastAttempt)
			}
			require.Nil(t, r.Token)
			require.Nil(t, r.ClaimedBy)
			require.Nil(t, r.Lease)
			require.True(t, b.claimsInclude(t, id), "a handed-back domain must be claimable at once")
		})
	}
}

// A hand-back at shutdown wakes the other instances (the trigger sees the row enter
// the claimable set): they would otherwise take the domain only at their next poll. A
// quiet hand-back, for a pause, wakes nobody: nothing can claim the row before the
// pause ends, and a fleet handing back its orders at once would wake everyone for
// nothing.
func TestRelease_WakesTheOtherInstancesUnlessQuiet(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	id, _ := b.domain(t, tn, "pending", 0, nil)
	quietID, _ := b.domain(t, tn, "pending", 2, ago(3600))
	claims, err := b.q.Claim(b.ctx, "test", testDirectory, 2)
	require.NoError(t, err)
	require.Len(t, claims, 2)
	c, quiet := claims[0], claims[1]
	if c.ID != id {
		c, quiet = quiet, c
	}
	n := b.notifications(t, func() { require.NoError(t, b.q.Release(b.ctx, c, false)) })
	require.Equal(t, 1, n, "a hand-back must wake the other instances once")

	n = b.notifications(t, func() { require.NoError(t, b.q.Release(b.ctx, quiet, true)) })
	require.Zero(t, n, "a quiet hand-back woke the other instances")
	r := b.sslRow(t, quietID)
	require.Equal(t, "pending", r.Status)
	require.Equal(t, 2, r.Attempts, "a quiet hand-back was charged")

	// A hand-back of a claim already gone changes nothing and wakes nobody.
	n = b.notifications(t, func() { require.ErrorIs(t, b.q.Release(b.ctx, c, false), issuing.ErrClaimLost) })
	require.Zero(t, n)
}

// The lease is what keeps a live order from being reclaimed; the heartbeat is what
// tells an instance that came back from a stall that its claim is gone, so it stops
// the order instead of racing the instance that took it over.
func TestHeartbeat_ExtendsTheLeaseAndReportsLostClaims(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	id, _ := b.domain(t, tn, "pending", 0, nil)
	held := b.claimOne(t, id)
	releasedID, _ := b.domain(t, tn, "pending", 0, nil)
	released := b.claimOne(t, releasedID)
	require.NoError(t, b.q.Release(b.ctx, released, false))
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_lease_expires_at = now() + interval '5 seconds' WHERE id = $1`, id)
	require.NoError(t, err)

	unknown := uuid.NewString()
	leases, err := b.q.Heartbeat(b.ctx, []string{held.Token, unknown, released.Token})
	require.NoError(t, err)
	require.Equal(t, []string{held.Token}, leases.Renewed)
	require.ElementsMatch(t, []string{unknown, released.Token}, leases.Lost)
	require.Empty(t, leases.Expired)
	require.Empty(t, leases.Busy)

	var remaining time.Duration
	require.NoError(t, b.pool.QueryRow(b.ctx,
		`SELECT ssl_lease_expires_at - now() FROM proxy_domains WHERE id = $1`, id).Scan(&remaining))
	require.Greater(t, remaining, b.q.Config().Lease-5*time.Second, "the lease was not extended")
	require.LessOrEqual(t, remaining, b.q.Config().Lease)

	leases, err = b.q.Heartbeat(b.ctx, nil)
	require.NoError(t, err)
	require.Equal(t, queue.Leases{}, leases)
}

// The order recorded for the domain (certworker_orders, for whoever takes it next to
// resume) is forgotten in the statement that stores its certificate, and only then:
// a claim that no longer holds the row leaves it, so the order can still be resumed.
func TestMarkActive_ForgetsTheRecordedOrderWithTheCertificateStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t), "pending", 0, nil)
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO certworker_orders (domain_id, directory, order_url) VALUES ($1, 'https://ca.example/dir', 'https://ca.example/order/1')`, id)
	require.NoError(t, err)
	recorded := func() int {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM certworker_orders WHERE domain_id = $1`, id).Scan(&n))
		return n
	}
	c := b.claimOne(t, id)
	stale := c
	stale.Token = uuid.NewString()
	now := nowSecond()
	require.ErrorIs(t, b.markActive(stale, mintCertificate(t, name, now, now.Add(90*24*time.Hour))), issuing.ErrClaimLost)
	require.Equal(t, 1, recorded(), "a lost claim forgot the order")
	require.NoError(t, b.markActive(c, mintCertificate(t, name, now, now.Add(90*24*time.Hour))))
	require.Zero(t, recorded(), "the stored certificate's order is still recorded")
}

// A store whose statement committed but whose answer the worker never got (cut off
// by its deadline as it committed, on a busy server) is retried with the same claim
// and certificate. The retry finds the claim's token gone, which its own first try
// took away: it reports the store done, not the claim lost, so the order is counted
// issued. A retry that finds another certificate stored (another instance's) still
// reports the claim lost.
func TestMarkActive_ARetryOfAStoreThatCommittedReportsItDone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t), "pending", 0, nil)
	c := b.claimOne(t, id)
	cert := mintCertificate(t, name, nowSecond(), nowSecond().Add(90*24*time.Hour))
	_, err := b.q.MarkActive(b.ctx, c, cert)
	require.NoError(t, err)

	renewIn, err := b.q.MarkActive(b.ctx, c, cert)
	require.NoError(t, err, "the retry of a store that committed")
	require.InDelta(t, time.Until(cert.RenewAt).Seconds(), renewIn.Seconds(), 5)
	require.Equal(t, "active", b.status(t, id))

	other := mintCertificate(t, name, nowSecond(), nowSecond().Add(90*24*time.Hour))
	_, err = b.q.MarkActive(b.ctx, c, other)
	require.ErrorIs(t, err, issuing.ErrClaimLost, "a store of a certificate the row does not hold")
}
