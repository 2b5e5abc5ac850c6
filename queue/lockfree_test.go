package queue_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// unverified inserts a pending ACME domain of tenant that is not verified yet: the
// proxy's verify moves it into the queue.
func (b *bundle) unverified(t *testing.T, tenant, name string) string {
	t.Helper()
	var id string
	require.NoError(t, b.pool.QueryRow(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_token, ssl_status, ssl_provider)
VALUES ($1, $2, 'tok', 'pending', 'acme') RETURNING id::text`, tenant, name).Scan(&id))
	return id
}

// proxyTx is a transaction of the proxy's on a connection of its own.
func (b *bundle) proxyTx(t *testing.T) pgx.Tx {
	t.Helper()
	conn, err := pgx.Connect(b.ctx, b.dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	_, err = conn.Exec(b.ctx, `SET deadlock_timeout = '20ms'`)
	require.NoError(t, err)
	tx, err := conn.Begin(b.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

const verifySQL = `UPDATE proxy_domains SET verification_status = 'verified' WHERE id = $1`

// Two transactions of the proxy's that verify domains of tenants A and B, one A then
// B and the other B then A, cannot deadlock: the wake trigger takes no lock either can
// wait on (a per-tenant counter row it upserted would give 40P01 in every pair).
func TestTrigger_OppositeOrderVerifiesNeverDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ta, tb := b.tenant(t), b.tenant(t)
	const pairs = 40
	deadlocks, other := 0, 0
	for i := range pairs {
		a1, a2 := b.unverified(t, ta, fmt.Sprintf("a1-%d.example", i)), b.unverified(t, ta, fmt.Sprintf("a2-%d.example", i))
		b1, b2 := b.unverified(t, tb, fmt.Sprintf("b1-%d.example", i)), b.unverified(t, tb, fmt.Sprintf("b2-%d.example", i))
		tx1, tx2 := b.proxyTx(t), b.proxyTx(t)
		_, err := tx1.Exec(b.ctx, verifySQL, a1)
		require.NoError(t, err)
		_, err = tx2.Exec(b.ctx, verifySQL, b2)
		require.NoError(t, err)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for j, step := range []struct {
			tx pgx.Tx
			id string
		}{{tx1, b1}, {tx2, a2}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
				defer cancel()
				if _, err := step.tx.Exec(ctx, verifySQL, step.id); err != nil {
					errs[j] = err
					return
				}
				errs[j] = step.tx.Commit(ctx)
			}()
		}
		wg.Wait()
		for _, err := range errs {
			var pgErr *pgconn.PgError
			switch {
			case err == nil:
			case errors.As(err, &pgErr) && pgErr.Code == "40P01":
				deadlocks++
			default:
				other++
				t.Logf("pair %d: %v", i, err)
			}
		}
	}
	require.Zero(t, deadlocks, "deadlocks in %d pairs", pairs)
	require.Zero(t, other)
	var queued int
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT count(*) FROM proxy_domains WHERE verification_status = 'verified' AND ssl_status = 'pending'`).Scan(&queued))
	require.Equal(t, 4*pairs, queued)
}

// An open verify of tenant T (a transaction of the proxy's that has not committed)
// delays neither the reclaim of T's abandoned claim, nor a failure write of T's
// domain, nor the claim of T's other rows: none of them may wait on a lock the verify
// holds, or one open transaction would hold up the whole fleet's reclaim. The verify
// is held while the three run, up to 20 s; each must be done in 2 s.
func TestOpenVerify_DelaysNoWriteOfOurs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	abandoned := b.named(t, tn, "abandoned.example")
	failing := b.named(t, tn, "failing.example")
	b.named(t, tn, "other1.example")
	b.named(t, tn, "other2.example")
	claims, err := b.q.Claim(b.ctx, "test", testDirectory, 2)
	require.NoError(t, err)
	require.Len(t, claims, 2)
	var fail issuing.Claim
	for _, c := range claims {
		if c.ID == failing {
			fail = c
		}
	}
	require.Equal(t, failing, fail.ID, "claimed %v", names(claims))
	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_lease_expires_at = now() - interval '1 second' WHERE id = $1`, abandoned)
	require.NoError(t, err)

	verify := b.proxyTx(t)
	_, err = verify.Exec(b.ctx, verifySQL, b.unverified(t, tn, "verifying.example"))
	require.NoError(t, err)
	held := time.AfterFunc(20*time.Second, func() { _ = verify.Commit(context.Background()) })
	defer held.Stop()

	bounded := func(what string, f func(ctx context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
		defer cancel()
		require.NoError(t, f(ctx), "%s waited behind the open verify", what)
	}
	bounded("the reclaim", func(ctx context.Context) error {
		r, err := b.q.ReclaimAbandoned(ctx)
		if err == nil && (len(r) != 1 || r[0].ID != abandoned) {
			err = fmt.Errorf("reclaimed %v", r)
		}
		return err
	})
	bounded("the failure write", func(ctx context.Context) error {
		_, err := b.q.MarkFailed(ctx, fail, "boom")
		return err
	})
	bounded("the claim", func(ctx context.Context) error {
		got, err := b.q.Claim(ctx, "test", testDirectory, 10)
		if err == nil && len(got) != 3 {
			err = fmt.Errorf("claimed %v, want the abandoned row and the other two", names(got))
		}
		return err
	})
	require.NoError(t, verify.Commit(b.ctx))
}

// The queue's clock follows only the tier it orders: tenant A has 500 first
// issuances queued and one urgent renewal; the renewal is claimed; then a newcomer
// verifies one domain. It is among the next claims, not behind A's backlog, as it
// would be if the renewal's place moved the first issuances' clock.
func TestClaim_AnUrgentRenewalDoesNotPushNewcomersBehindABacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, newcomer := b.tenant(t), b.tenant(t)
	b.bulk(t, a, "a", 500)
	b.urgentRenewal(t, a, "renew.example", 48*time.Hour)
	require.Equal(t, []string{"renew.example"}, b.claimNames(t, 1))
	b.named(t, newcomer, "new.example")
	require.Contains(t, b.claimNames(t, 2), "new.example", "the newcomer waited behind A's backlog")
}

// urgentRenewal queues a renewal of tenant's name whose certificate (90 days) expires
// in expiresIn, as the renewal pass does (active -> pending with ssl_renew_by).
func (b *bundle) urgentRenewal(t *testing.T, tenant, name string, expiresIn time.Duration) {
	t.Helper()
	notAfter := time.Now().Add(expiresIn)
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider, ssl_renew_by)
VALUES ($1, $2, 'verified', 'tok', 'active', 'acme', $3)`, tenant, name,
		issuing.RenewBy(notAfter.Add(-90*24*time.Hour), notAfter, time.Time{}))
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_status = 'pending' WHERE domain = $1`, name)
	require.NoError(t, err)
}

// Two tenants' bulk imports, the second arriving after the queue has served part of
// the first: from then on they take turns, one each a round. The second's rows are
// placed from the tier's clock on; a clock that stood still (pinned) would place them
// before the first's remaining rows, and serve all of them first.
func TestClaim_TwoBacklogsArrivingAtDifferentTimesTakeTurns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, c := b.tenant(t), b.tenant(t)
	b.bulk(t, a, "a", 100)
	require.Len(t, b.claimNames(t, 30), 30)
	b.bulk(t, c, "c", 100)
	next := b.claimNames(t, 20)
	require.Len(t, next, 20)
	fromC := 0
	for i, n := range next {
		if n[0] == 'c' {
			fromC++
		}
		if i > 0 {
			require.NotEqual(t, next[i-1][0], n[0], "one tenant served twice in a row: %v", next)
		}
	}
	require.Equal(t, 10, fromC, "%v", next)
}

// Within the urgent tier tenants take turns, each tenant's earliest expiry first (a
// mass revocation). A has five urgent renewals, queued latest expiry first; B has two,
// queued after. The claim serves B, A, B, A (B queued last goes first on a tied turn),
// then A's other three, each tenant's in order of expiry.
func TestClaim_UrgentRenewalsTenantsTakeTurnsEarliestExpiryFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, bt := b.tenant(t), b.tenant(t)
	for i := 5; i >= 1; i-- {
		b.urgentRenewal(t, a, fmt.Sprintf("a%d.example", i), time.Duration(i)*time.Hour)
	}
	b.urgentRenewal(t, bt, "b2.example", 20*time.Hour)
	b.urgentRenewal(t, bt, "b1.example", 10*time.Hour)
	var got []string
	for range 7 {
		got = append(got, b.claimNames(t, 1)...)
	}
	require.Equal(t, []string{"b1.example", "a1.example", "b2.example", "a2.example", "a3.example", "a4.example", "a5.example"}, got)
}

// While first issuances are due, the newcomers' share of a claim goes to them
// whatever the urgent renewals ahead: with 40 urgent renewals queued (a mass
// revocation) a newcomer that verifies is in the next claim that keeps a slot for
// newcomers, and the rest of the claim follows the order of service.
func TestClaimShared_NewcomersGetTheirShareDuringAMassRenewal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	big, newcomer := b.tenant(t), b.tenant(t)
	for i := range 40 {
		b.urgentRenewal(t, big, fmt.Sprintf("r%d.example", i), time.Duration(i+1)*time.Hour)
	}
	b.named(t, newcomer, "new.example")
	plain, err := b.q.Claim(b.ctx, "test", testDirectory, 4)
	require.NoError(t, err)
	require.NotContains(t, names(plain), "new.example", "without a share the newcomer waits behind urgent renewals")
	claims, err := b.q.ClaimShared(b.ctx, "test", testDirectory, 4, 1)
	require.NoError(t, err)
	got := names(claims)
	require.Len(t, got, 4)
	require.Equal(t, "new.example", got[0], "%v", got)
	for _, c := range claims {
		require.Equal(t, c.Domain == "new.example", c.FirstIssuance, "%s", c.Domain)
	}
}

// A failure takes its row out of line, and the claim reads only rows in line; the
// row comes back in line once its backoff by the current formula has run out, so a
// shorter --retry-base, or a hand edit of its attempts, takes effect at the next claim.
func TestClaim_ARowInBackoffIsOutOfLineUntilTheCurrentFormulaSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	id := b.named(t, tn, "fails.example")
	c := b.claimOne(t, id)
	_, err := b.q.MarkFailed(b.ctx, c, "boom")
	require.NoError(t, err)
	require.Equal(t, "backoff", b.held(t, id))
	require.Empty(t, b.claimNames(t, 10), "claimed inside its backoff")
	require.Equal(t, "backoff", b.held(t, id))

	// A fleet restarted with a shorter --retry-base: the same row is due now.
	cfg := issuing.DefaultConfig()
	cfg.RetryBase = time.Millisecond
	short := queue.New(b.pool, cfg)
	time.Sleep(5 * time.Millisecond)
	claims, err := short.Claim(b.ctx, "test", testDirectory, 10)
	require.NoError(t, err)
	require.Equal(t, []string{"fails.example"}, names(claims))
}

// A row in line under a pause that started is taken out of line by the claim (not by
// the pause, which never updates a proxy row), and comes back once the pause ends.
func TestClaim_RowsUnderAPauseAreTakenOutOfLineAndComeBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	var ids []string
	for i := range 30 {
		ids = append(ids, b.named(t, tn, fmt.Sprintf("s%d.paused.example", i)))
	}
	b.named(t, tn, "free.example")
	_, err := b.q.Pause(b.ctx, issuing.ScopeRegisteredDomain, "paused.example", issuing.PauseRateLimit, time.Hour, "rate limited")
	require.NoError(t, err)
	require.Equal(t, []string{"free.example"}, b.claimNames(t, 10))
	for _, id := range ids {
		require.Equal(t, "registered_domain:paused.example", b.held(t, id))
	}
	_, err = b.pool.Exec(b.ctx, `UPDATE certworker_pauses SET paused_until = now()`)
	require.NoError(t, err)
	require.Len(t, b.claimNames(t, 100), 30)
}

func (b *bundle) held(t *testing.T, id string) string {
	t.Helper()
	var h *string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ssl_held FROM proxy_domains WHERE id = $1`, id).Scan(&h))
	if h == nil {
		return ""
	}
	return *h
}

// ClaimInLine claims from the rows in line as they stand: a row held out of line
// whose backoff has run out stays out, and a row in line is claimed beside it;
// ClaimShared brings the held row back first and claims it. Guards against the
// claim of a notification's pass bringing held rows back (a statement before the
// claim a tenant waits for), and against a ClaimShared that forgot to.
func TestClaimInLine_LeavesHeldRowsOutAndClaimSharedBringsThemBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	held := b.named(t, tn, "held.example")
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_held = 'backoff', ssl_attempts = 1,
        ssl_last_attempt_at = now() - interval '1 hour' WHERE id = $1`, held)
	require.NoError(t, err)
	b.named(t, tn, "inline.example")

	claims, err := b.q.ClaimInLine(b.ctx, "test", testDirectory, 10, 1)
	require.NoError(t, err)
	require.Equal(t, []string{"inline.example"}, names(claims))
	require.Equal(t, "backoff", b.held(t, held), "ClaimInLine brought the held row back")

	claims, err = b.q.ClaimShared(b.ctx, "test", testDirectory, 10, 1)
	require.NoError(t, err)
	require.Equal(t, []string{"held.example"}, names(claims))
}

// ReturnHeld writes its settings and the CA's directory into its statement as
// literals (so that the server plans it once per session): --retry-base still
// decides whether a held row's backoff has run out, and a directory with a quote and
// a backslash in it is one literal, not the end of one.
func TestReturnHeld_ItsSettingsAndDirectoryWrittenAsLiteralsStillDecide(t *testing.T) {
	t.Parallel()
	b := setup(t)
	held := b.named(t, b.tenant(t), "held.example")
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_held = 'backoff', ssl_attempts = 1,
        ssl_last_attempt_at = now() - interval '1 hour' WHERE id = $1`, held)
	require.NoError(t, err)
	const directory = `https://ca.invalid/o'brien\dir`

	// Attempt 1 waits 2 x --retry-base: 2 hours at a base of one hour.
	slow := issuing.DefaultConfig()
	slow.RetryBase, slow.RetryMax = time.Hour, 24*time.Hour
	returned, err := queue.New(b.pool, slow).ReturnHeld(b.ctx, directory)
	require.NoError(t, err)
	require.Zero(t, returned)
	require.Equal(t, "backoff", b.held(t, held), "a row in its backoff came back at a base of one hour")

	// At the default base (a minute) its backoff ran out long ago.
	returned, err = queue.New(b.pool, issuing.DefaultConfig()).ReturnHeld(b.ctx, directory)
	require.NoError(t, err)
	require.EqualValues(t, 1, returned)
	require.Empty(t, b.held(t, held), "a row whose backoff has run out stayed held")
}
