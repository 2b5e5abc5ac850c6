package queue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// secondDirectory is the second CA of the tests of the routed claim.
const secondDirectory = "https://second.invalid/directory"

// routed is a queue whose claim routes between testDirectory and secondDirectory,
// with after as --acme-fallback-after.
func (b *bundle) routed(after time.Duration) *queue.Queue {
	return b.routedOn(b.pool, after)
}

// routedOn is routed on db.
func (b *bundle) routedOn(db queue.DB, after time.Duration) *queue.Queue {
	cfg := issuing.DefaultConfig()
	cfg.Fallback = &issuing.Fallback{Directory: secondDirectory, After: after}
	return queue.New(db, cfg)
}

// claimAll claims everything due through q and returns the claims by id.
func (b *bundle) claimAll(t *testing.T, q *queue.Queue) map[string]issuing.Claim {
	t.Helper()
	out := map[string]issuing.Claim{}
	for {
		claims, err := q.Claim(b.ctx, "test", testDirectory, 10)
		require.NoError(t, err)
		if len(claims) == 0 {
			return out
		}
		for _, c := range claims {
			out[c.ID] = c
		}
	}
}

// dueSince makes domain id fall due secs seconds ago (its queue time), and the
// holds of every pause begin holdSecs ago.
func (b *bundle) backdate(t *testing.T, id string, dueSecs, holdSecs int) {
	t.Helper()
	b.exec(t, `UPDATE proxy_domains SET ssl_queued_at = now() - make_interval(secs => $2),
	                                  ssl_waiting_since = now() - make_interval(secs => $2) WHERE id = $1`, id, dueSecs)
	b.exec(t, `UPDATE certworker_pauses SET held_since = now() - make_interval(secs => $1),
	                                        created_at = now() - make_interval(secs => $1)`, holdSecs)
	// As time passing would: a row a claim held out until its decision could change
	// comes back at the next claim (ReturnHeld).
	b.exec(t, `UPDATE proxy_domains SET ssl_held_until = now() - interval '1 second' WHERE id = $1 AND ssl_held = 'routed'`, id)
}

// The decision recorded on the row: every instance reads the same one.
func (b *bundle) decision(t *testing.T, id string) (directory, cause *string) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(b.ctx,
		`SELECT ssl_ca_directory, ssl_ca_cause FROM proxy_domains WHERE id = $1`, id).Scan(&directory, &cause))
	return directory, cause
}

// Nothing holds a domain back at the first CA: it goes there, and the decision is on
// its row.
func TestClaimRouted_GoesToTheFirstCAWhenNothingHoldsItBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "pending", 0, nil)
	got := b.claimAll(t, b.routed(10*time.Minute))
	require.Contains(t, got, id)
	require.Equal(t, testDirectory, got[id].Directory)
	require.Empty(t, got[id].FallbackCause)
	dir, cause := b.decision(t, id)
	require.Equal(t, testDirectory, *dir)
	require.Nil(t, cause)
}

// The first CA's outage: a domain held back by it for longer than
// --acme-fallback-after goes to the second, one held back for less waits, measured
// from when the domain fell due (a domain verified late in a long outage waits its
// own time), and nothing is claimed for the first while its pause is in force.
func TestClaimRouted_AnOutageLongerThanAfterSendsADomainToTheSecondCA(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	long, _ := b.domain(t, tn, "pending", 0, nil)
	late, _ := b.domain(t, tn, "pending", 0, nil)
	_, err := b.q.PauseUnreachable(b.ctx, testDirectory, "connection refused", time.Hour, time.Hour)
	require.NoError(t, err)
	b.backdate(t, long, 3600, 1200)
	b.backdate(t, late, 60, 1200)

	got := b.claimAll(t, b.routed(10*time.Minute))
	require.Len(t, got, 1, "a domain held back for less than --acme-fallback-after was claimed")
	require.Equal(t, secondDirectory, got[long].Directory)
	require.Equal(t, issuing.FallbackOutage, got[long].FallbackCause)
	dir, cause := b.decision(t, long)
	require.Equal(t, secondDirectory, *dir)
	require.Equal(t, issuing.FallbackOutage, *cause)

	// The outage began 5 minutes ago: nobody goes anywhere yet.
	b2 := setup(t)
	early, _ := b2.domain(t, b2.tenant(t), "pending", 0, nil)
	_, err = b2.q.PauseUnreachable(b2.ctx, testDirectory, "connection refused", time.Hour, time.Hour)
	require.NoError(t, err)
	b2.backdate(t, early, 3600, 300)
	require.Empty(t, b2.claimAll(t, b2.routed(10*time.Minute)))
}

// A rate limit of the first CA on one registered domain sends its names to the second
// once it has held them back long enough; other tenants' names still go to the first.
func TestClaimRouted_ARateLimitedRegisteredDomainGoesToTheSecondCAOthersStay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	held := b.named(t, tn, "a.shop.example")
	other := b.named(t, b.tenant(t), "www.elsewhere.example")
	_, err := b.q.PauseAt(b.ctx, testDirectory, issuing.ScopeRegisteredDomain, "shop.example", issuing.PauseRateLimit, time.Hour, "too many")
	require.NoError(t, err)
	b.backdate(t, held, 3600, 1200)
	b.backdate(t, other, 3600, 1200)

	got := b.claimAll(t, b.routed(10*time.Minute))
	require.Len(t, got, 2)
	require.Equal(t, secondDirectory, got[held].Directory)
	require.Equal(t, issuing.FallbackRateLimit, got[held].FallbackCause)
	require.Equal(t, testDirectory, got[other].Directory)
}

// Pauses are kept per CA: the second CA's pause of a registered domain does not hold
// its names back at the first, and when both hold them back, they wait.
func TestClaimRouted_OneCAsPauseDoesNotHoldADomainBackAtTheOther(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.named(t, b.tenant(t), "a.shop.example")
	_, err := b.q.PauseAt(b.ctx, secondDirectory, issuing.ScopeRegisteredDomain, "shop.example", issuing.PauseRateLimit, time.Hour, "second's limit")
	require.NoError(t, err)
	b.backdate(t, id, 3600, 1200)
	// Neither the routed claim nor a fleet's with one CA.
	require.True(t, b.claimsInclude(t, id), "the second CA's pause held a domain back at the first (claim without a second CA)")
	b.exec(t, `UPDATE proxy_domains SET ssl_status = 'pending', ssl_last_attempt_at = NULL WHERE id = $1`, id)
	got := b.claimAll(t, b.routed(10*time.Minute))
	require.Equal(t, testDirectory, got[id].Directory)

	b.exec(t, `UPDATE proxy_domains SET ssl_status = 'pending', ssl_last_attempt_at = NULL WHERE id = $1`, id)
	_, err = b.q.PauseAt(b.ctx, testDirectory, issuing.ScopeRegisteredDomain, "shop.example", issuing.PauseLedger, time.Hour, "first's ledger")
	require.NoError(t, err)
	b.backdate(t, id, 3600, 1200)
	require.Empty(t, b.claimAll(t, b.routed(10*time.Minute)), "a domain both CAs hold back was claimed")
}

// A name the first CA refused for good goes to the second at once, whatever the
// first's state; one the second refused goes to the first only, and waits while the
// first holds it back.
func TestClaimRouted_ARefusedNameGoesToTheOtherCAAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	refusedByFirst, _ := b.domain(t, tn, "pending", 0, nil)
	refusedBySecond, _ := b.domain(t, tn, "pending", 0, nil)
	b.exec(t, `UPDATE proxy_domains SET ssl_ca_refused = $2 WHERE id = $1`, refusedByFirst, testDirectory)
	b.exec(t, `UPDATE proxy_domains SET ssl_ca_refused = $2 WHERE id = $1`, refusedBySecond, secondDirectory)

	got := b.claimAll(t, b.routed(time.Hour))
	require.Equal(t, secondDirectory, got[refusedByFirst].Directory)
	require.Equal(t, issuing.FallbackRefused, got[refusedByFirst].FallbackCause)
	require.Equal(t, testDirectory, got[refusedByFirst].RefusedBy)
	require.Equal(t, testDirectory, got[refusedBySecond].Directory)
	require.Equal(t, secondDirectory, got[refusedBySecond].RefusedBy)

	b.exec(t, `UPDATE proxy_domains SET ssl_status = 'pending', ssl_last_attempt_at = NULL`)
	_, err := b.q.PauseUnreachable(b.ctx, testDirectory, "down", time.Hour, time.Hour)
	require.NoError(t, err)
	b.backdate(t, refusedBySecond, 7200, 7200)
	got = b.claimAll(t, b.routed(time.Minute))
	require.Contains(t, got, refusedByFirst)
	require.NotContains(t, got, refusedBySecond, "a name the second CA refused was sent there, or to a first CA that is down")
}

// A certificate of the second CA is renewed by the first when the first is free, and
// where it was issued while the first is held back at all; either way the claim says
// which CA issued the stored certificate.
func TestClaimRouted_ACertificateOfTheSecondCAIsRenewedByTheFirstWhenItIsFree(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t), "pending", 0, nil)
	b.putCert(t, name, "chain", nil)
	b.exec(t, `UPDATE proxy_certificates SET issuer_directory = $2 WHERE domain = $1`, name, secondDirectory)

	got := b.claimAll(t, b.routed(time.Hour))
	require.Equal(t, testDirectory, got[id].Directory)
	require.Equal(t, secondDirectory, got[id].CertDirectory)

	b.exec(t, `UPDATE proxy_domains SET ssl_status = 'pending', ssl_last_attempt_at = NULL`)
	_, err := b.q.PauseAt(b.ctx, testDirectory, issuing.ScopeCA, testDirectory, issuing.PauseLedger, time.Hour, "first's ledger")
	require.NoError(t, err)
	got = b.claimAll(t, b.routed(time.Hour))
	require.Equal(t, secondDirectory, got[id].Directory, "the first CA is held back: renewed by the second at once")
	require.Equal(t, issuing.FallbackRenewal, got[id].FallbackCause)
}

// How long a hold has lasted is from its start: a pause extended while in force
// keeps its start; one written again after it ended starts anew. Without that, a
// rate limit that lifted an hour ago would send a domain held back a second ago to
// the second CA at once.
func TestPause_AHoldBeginsAgainOnlyAfterItEnded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	since := func() time.Duration {
		var secs float64
		require.NoError(t, b.pool.QueryRow(b.ctx,
			`SELECT EXTRACT(epoch FROM now() - held_since) FROM certworker_pauses WHERE directory = $1 AND scope = 'domain'`,
			testDirectory).Scan(&secs))
		return time.Duration(secs * float64(time.Second))
	}
	_, err := b.q.PauseAt(b.ctx, testDirectory, issuing.ScopeDomain, "a.example", issuing.PauseRateLimit, time.Hour, "one")
	require.NoError(t, err)
	b.exec(t, `UPDATE certworker_pauses SET held_since = now() - interval '20 minutes'`)
	_, err = b.q.PauseAt(b.ctx, testDirectory, issuing.ScopeDomain, "a.example", issuing.PauseRateLimit, time.Hour, "two")
	require.NoError(t, err)
	require.InDelta(t, (20 * time.Minute).Seconds(), since().Seconds(), 5, "extending a pause in force moved its start")

	b.exec(t, `UPDATE certworker_pauses SET paused_until = now() - interval '1 second'`)
	_, err = b.q.PauseAt(b.ctx, testDirectory, issuing.ScopeDomain, "a.example", issuing.PauseRateLimit, time.Hour, "three")
	require.NoError(t, err)
	require.Less(t, since(), 5*time.Second, "a pause written again after it ended kept the old start")
}

// With a second CA, the timer does not wait for the end of the first CA's pause: a
// domain it holds back may go to the second after --acme-fallback-after.
func TestNextDue_WithASecondCAIsNoLaterThanTheFallback(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.domain(t, b.tenant(t), "pending", 0, nil)
	_, err := b.q.PauseAt(b.ctx, testDirectory, issuing.ScopeCA, testDirectory, issuing.PauseRateLimit, time.Hour, "slow down")
	require.NoError(t, err)
	d, ok, err := b.q.NextDue(b.ctx, testDirectory)
	require.NoError(t, err)
	require.True(t, ok)
	require.InDelta(t, time.Hour.Seconds(), d.Seconds(), 5, "one CA: the pause's end")
	routed := b.routed(2 * time.Minute)
	d, ok, err = routed.NextDue(b.ctx, testDirectory)
	require.NoError(t, err)
	require.True(t, ok)
	require.Zero(t, d, "two CAs: a row in line no claim has read is due now")
	require.Empty(t, b.claimAll(t, routed), "a row held back for less than --acme-fallback-after was claimed")
	d, ok, err = routed.NextDue(b.ctx, testDirectory)
	require.NoError(t, err)
	require.True(t, ok)
	require.InDelta(t, (2 * time.Minute).Seconds(), d.Seconds(), 5, "two CAs: --acme-fallback-after from the hold's start")
}

// The certificate records the CA that issued it, and an upload forgets it.
func TestMarkActive_RecordsTheIssuingCA(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t), "pending", 0, nil)
	c := b.claimOne(t, id)
	now := time.Now()
	require.NoError(t, b.markActive(c, &issuing.Certificate{ChainPEM: "chain", PrivateKey: "key", NotBefore: now,
		NotAfter: now.Add(90 * 24 * time.Hour), Directory: secondDirectory}))
	require.Equal(t, []string{secondDirectory}, b.strings(t, `SELECT issuer_directory FROM proxy_certificates WHERE domain = $1`, name))
	o, err := b.q.Overview(b.ctx)
	require.NoError(t, err)
	require.Equal(t, []queue.IssuerCount{{Directory: secondDirectory, Certificates: 1}}, o.Issuers, "status does not count it by CA")
	// The certificate's window start is forgotten too.
	b.exec(t, `UPDATE proxy_certificates SET ari_window_start = now() WHERE domain = $1`, name)
	b.exec(t, `UPDATE proxy_certificates SET certificate_pem = 'uploaded' WHERE domain = $1`, name)
	require.Empty(t, b.strings(t, `SELECT domain FROM proxy_certificates WHERE domain = $1 AND ari_window_start IS NOT NULL`, name),
		"an upload kept the replaced certificate's renewal window")
	o, err = b.q.Overview(b.ctx)
	require.NoError(t, err)
	require.Equal(t, []queue.IssuerCount{{Directory: "", Certificates: 1}}, o.Issuers)
	require.Empty(t, b.strings(t, `SELECT issuer_directory FROM proxy_certificates WHERE domain = $1 AND issuer_directory IS NOT NULL`, name))
}

// `certworker retry` asks again a CA that refused the name.
func TestRetry_ForgetsACAsRefusal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t), "failed", 1, ago(10))
	b.exec(t, `UPDATE proxy_domains SET ssl_ca_refused = $2 WHERE id = $1`, id, testDirectory)
	require.NoError(t, b.q.Retry(b.ctx, name))
	require.Empty(t, b.strings(t, `SELECT ssl_ca_refused FROM proxy_domains WHERE id = $1 AND ssl_ca_refused IS NOT NULL`, id))
}

// With a second CA, the next due time is exact whatever the second CA says: a row
// held back at the first for longer than --acme-fallback-after, while the second is
// paused too, is due when the earlier of the two pauses lets it go (here the
// second's, in 10 minutes), and a row in its backoff is due when the backoff ends.
// Both were "due now" for as long as any pause of the first older than
// --acme-fallback-after was in force, and the timers fell back to the poll.
func TestNextDue_WithASecondCAIsExactWithTheSecondsPauses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	id, _ := b.domain(t, tn, "pending", 0, nil)
	_, err := b.q.PauseAt(b.ctx, testDirectory, issuing.ScopeCA, testDirectory, issuing.PauseRateLimit, time.Hour, "slow down")
	require.NoError(t, err)
	b.backdate(t, id, 3600, 3600)
	_, err = b.q.PauseAt(b.ctx, secondDirectory, issuing.ScopeCA, secondDirectory, issuing.PauseRateLimit, 10*time.Minute, "slow down too")
	require.NoError(t, err)
	q := b.routed(2 * time.Minute)
	require.Empty(t, b.claimAll(t, q), "a row both CAs hold back was claimed")
	d, ok, err := q.NextDue(b.ctx, testDirectory)
	require.NoError(t, err)
	require.True(t, ok)
	require.InDelta(t, (10 * time.Minute).Seconds(), d.Seconds(), 5, "the second CA's pause")

	b.exec(t, `DELETE FROM certworker_pauses WHERE directory = $1`, secondDirectory)
	b.exec(t, `UPDATE proxy_domains SET ssl_attempts = 3, ssl_last_attempt_at = now(), ssl_held = 'backoff'`)
	d, ok, err = q.NextDue(b.ctx, testDirectory)
	require.NoError(t, err)
	require.True(t, ok)
	want := issuing.DefaultConfig().Backoff(3)
	require.InDelta(t, want.Seconds(), d.Seconds(), 5, "the row's own backoff")
}
