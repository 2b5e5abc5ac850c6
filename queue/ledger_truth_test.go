package queue_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// holdLedgerLock takes the ledger's lock of testDirectory in a transaction of a
// session of its own, as an instance in the middle of an Admit holds it, and returns
// its release.
func (b *bundle) holdLedgerLock(t *testing.T) (release func()) {
	t.Helper()
	conn, err := pgx.Connect(b.ctx, b.dsn)
	require.NoError(t, err)
	_, err = conn.Exec(b.ctx, `BEGIN`)
	require.NoError(t, err)
	_, err = conn.Exec(b.ctx, `SELECT pg_advisory_xact_lock(hashtext('certworker_ledger'), hashtext($1))`, testDirectory)
	require.NoError(t, err)
	var once sync.Once
	release = func() { once.Do(func() { conn.Close(context.Background()) }) }
	t.Cleanup(release)
	return release
}

// waitingForLocks is how many sessions wait for an advisory lock of the test's
// database.
func (b *bundle) waitingForLocks(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()`).Scan(&n))
	return n
}

func (b *bundle) times(t *testing.T, sql string) []time.Time {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, sql)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	require.NoError(t, err)
	return out
}

func (b *bundle) ledgerOutcomes(t *testing.T) []string {
	t.Helper()
	return b.strings(t, `SELECT name || ' ' || outcome FROM certworker_ledger ORDER BY id`)
}

// Rows older than a limit's window do not count against it: the CA's windows slide,
// and a ledger that counted last week's orders would hold a domain back for ever.
// Each limit is checked alone, with rows just outside its window that would fill it;
// and a failed authorization settled beside old ones does not pause its name. Guards
// against a count that lost its `at > now() - window`, which every test writing its
// rows at now() let through.
func TestAdmit_RowsOlderThanTheWindowDoNotCount(t *testing.T) {
	t.Parallel()
	hour := issuing.Limit{Count: 2, Window: time.Hour}
	for _, tc := range []struct {
		name    string
		limits  issuing.Limits
		outcome string
	}{
		{"orders per account", issuing.Limits{OrdersPerAccount: hour}, issuing.LedgerFailed},
		{"certificates per registered domain", issuing.Limits{CertsPerRegisteredDomain: hour}, issuing.LedgerIssued},
		{"certificates per exact set", issuing.Limits{CertsPerExactSet: hour}, issuing.LedgerIssued},
		{"failed authorizations per name", issuing.Limits{FailedAuthzPerName: hour}, issuing.LedgerFailedAuthz},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.named(t, b.tenant(t), "old.shop.example")
			// Two rows (the limit) a minute outside the window, and one well inside
			// the ledger's history.
			b.exec(t, `
INSERT INTO certworker_ledger (at, directory, name, registered_domain, outcome)
SELECT now() - interval '61 minutes' - make_interval(mins => g), $1, 'old.shop.example', 'shop.example', $2
FROM generate_series(0, 1) g`, testDirectory, tc.outcome)
			admitted, refused, err := b.q.Admit(b.ctx, testDirectory, tc.limits, b.admissions(t, false))
			require.NoError(t, err)
			require.Empty(t, refused, "rows outside the window were counted")
			require.Len(t, admitted, 1)
		})
	}
	t.Run("failed authorizations settled", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.named(t, b.tenant(t), "authz.example")
		b.exec(t, `
INSERT INTO certworker_ledger (at, directory, name, registered_domain, outcome)
SELECT now() - interval '2 hours', $1, 'authz.example', 'authz.example', 'failed_authz' FROM generate_series(1, 5)`, testDirectory)
		limits := issuing.Limits{FailedAuthzPerName: hour}
		admitted, _, err := b.q.Admit(b.ctx, testDirectory, limits, b.admissions(t, false))
		require.NoError(t, err)
		require.Len(t, admitted, 1)
		require.NoError(t, b.q.SettleLedger(b.ctx, testDirectory, admitted[0].Token, issuing.LedgerFailedAuthz, limits))
		require.Empty(t, b.strings(t, `SELECT reason FROM certworker_pauses`), "old failed authorizations were counted")
	})
}

// The ledger's lock is waited for a second at a time (a lock timeout of its own),
// retried, and given up when the caller's context ends, with ErrLedgerBusy and
// nothing recorded; the server is left with no wait of ours queued behind the holder.
// The lock was taken without a timeout: an instance cut off between the lock and its
// COMMIT stopped every Admit of the fleet. A lock freed while Admit retries is taken.
func TestAdmit_GivesUpOnABusyLedgerWhenItsContextEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	b.named(t, tn, "a.busy.example")
	b.named(t, tn, "b.busy.example")
	limits := issuing.Limits{OrdersPerAccount: issuing.Limit{Count: 10, Window: time.Hour}}
	as := b.admissions(t, false)
	release := b.holdLedgerLock(t)

	ctx, cancel := context.WithTimeout(b.ctx, 2500*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, _, err := b.q.Admit(ctx, testDirectory, limits, as)
		done <- err
	}()
	// Each try's wait is a wait of its own on the server (pg_locks.waitstart): a wait
	// that gives up after its lock timeout and starts again, rather than one wait
	// that lasts as long as the holder.
	waits := map[time.Time]bool{}
	var err error
	for err == nil {
		select {
		case err = <-done:
		case <-time.After(20 * time.Millisecond):
			for _, w := range b.times(t, `
SELECT l.waitstart FROM pg_locks l JOIN pg_database d ON d.oid = l.database
WHERE l.locktype = 'advisory' AND NOT l.granted AND l.waitstart IS NOT NULL AND d.datname = current_database()`) {
				waits[w] = true
			}
		}
	}
	require.ErrorIs(t, err, issuing.ErrLedgerBusy)
	require.GreaterOrEqual(t, len(waits), 2, "the lock was waited for in one wait, not tried again")
	require.Empty(t, b.ledgerOutcomes(t))
	require.Eventually(t, func() bool { return b.waitingForLocks(t) == 0 }, 3*time.Second, 20*time.Millisecond,
		"a wait for the ledger's lock outlived the Admit that gave up")

	// Held past the next Admit's first wait (ledgerLockWait, a second), so that it is
	// the retry that takes it.
	time.AfterFunc(1500*time.Millisecond, release)
	admitted, refused, err := b.q.Admit(b.ctx, testDirectory, limits, as)
	require.NoError(t, err)
	require.Len(t, admitted, 2)
	require.Empty(t, refused)
	require.Equal(t, []string{"a.busy.example pending", "b.busy.example pending"}, b.ledgerOutcomes(t))
}

// Pauses are written and lifted under the same lock: a settle waits for the ledger's
// lock before it lifts a pause. A settle that lifted without it could run between an
// Admit's count (which saw the order pending) and its COMMIT (which writes the pause
// the count called for), and leave a pause for as long as the window, a week.
func TestSettleLedger_LiftsPausesOnlyUnderTheLedgersLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	b.named(t, tn, "a.shop.example")
	b.named(t, tn, "b.shop.example")
	limits := issuing.Limits{CertsPerRegisteredDomain: issuing.Limit{Count: 1, Window: time.Hour}}
	admitted, refused, err := b.q.Admit(b.ctx, testDirectory, limits, b.admissions(t, false))
	require.NoError(t, err)
	require.Len(t, admitted, 1)
	require.Len(t, refused, 1)
	pause := `SELECT key FROM certworker_pauses WHERE scope = 'registered_domain' AND source = 'ledger'`
	require.Equal(t, []string{"shop.example"}, b.strings(t, pause))

	release := b.holdLedgerLock(t)
	ctx, cancel := context.WithTimeout(b.ctx, 1500*time.Millisecond)
	defer cancel()
	err = b.q.SettleLedger(ctx, testDirectory, admitted[0].Token, issuing.LedgerFailed, limits)
	require.ErrorIs(t, err, issuing.ErrLedgerBusy)
	require.Equal(t, []string{"shop.example"}, b.strings(t, pause), "the pause was lifted without the ledger's lock")
	require.Equal(t, []string{admitted[0].Domain + " pending"}, b.ledgerOutcomes(t))

	release()
	require.NoError(t, b.q.SettleLedger(b.ctx, testDirectory, admitted[0].Token, issuing.LedgerFailed, limits))
	require.Empty(t, b.strings(t, pause))
	require.Equal(t, []string{admitted[0].Domain + " failed"}, b.ledgerOutcomes(t))
}

// A renewal is exempt from the limits on new orders only when the CA has issued for
// the name before: a certificate stored by someone else (the tenant's upload, kept
// when the domain is switched from manual to acme) does not make the first ACME order
// a renewal. A certificate the ledger saw issued does make the next order one.
func TestAdmit_AForeignCertificateDoesNotMakeARenewal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	limits := issuing.Limits{OrdersPerAccount: issuing.Limit{Count: 1, Window: time.Hour}}

	// ours.example is issued through the ledger: a new order, then issued.
	b.named(t, tn, "ours.example")
	admitted, _, err := b.q.Admit(b.ctx, testDirectory, limits, b.admissions(t, false))
	require.NoError(t, err)
	require.Len(t, admitted, 1)
	require.NoError(t, b.q.SettleLedger(b.ctx, testDirectory, admitted[0].Token, issuing.LedgerIssued, limits))
	// The account's limit is now full; both domains come back holding a certificate.
	// The account's pause goes (the claim would take neither): this is about Admit.
	b.exec(t, `UPDATE proxy_domains SET ssl_status = 'pending', ssl_last_attempt_at = NULL, `+
		`ssl_claim_token = NULL, ssl_claimed_by = NULL, ssl_lease_expires_at = NULL`)
	b.exec(t, `DELETE FROM certworker_pauses`)
	b.named(t, tn, "uploaded.example")
	b.exec(t, `INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem) SELECT domain, 'pem', 'key' FROM proxy_domains`)

	admitted, refused, err := b.q.Admit(b.ctx, testDirectory, limits, b.admissions(t, true))
	require.NoError(t, err)
	require.Equal(t, []string{"ours.example"}, names(admitted), "only the renewal of a name the CA issued for passes the full account limit")
	require.Len(t, refused, 1)
	require.Equal(t, "uploaded.example", refused[0].Claim.Domain)
	require.Contains(t, refused[0].Reason, "new orders from the account")
	require.Equal(t, []string{"ours.example false", "ours.example true"},
		b.strings(t, `SELECT name || ' ' || renewal FROM certworker_ledger ORDER BY id`))
}

// An order whose end never reached the ledger (its instance died, or lost the answer
// of the COMMIT that recorded it) does not stay pending for ever: once it is older
// than any order can live it is recorded as unknown, still counted as the CA may
// have counted it, and replaced by its real outcome if that arrives late. A pending
// row younger than that is left alone.
func TestSettleStaleLedger_AnOrderThatOutlivedAnyOrderIsUnknownAndStillCounts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.named(t, b.tenant(t), "stale.example")
	b.exec(t, `
INSERT INTO certworker_ledger (at, directory, name, registered_domain, claim_token, outcome)
VALUES (now() - interval '20 minutes', $1, 'stale.example', 'stale.example', '11111111-1111-1111-1111-111111111111', 'pending'),
       (now() - interval '5 minutes', $1, 'young.example', 'young.example', NULL, 'pending')`, testDirectory)

	n, err := b.q.SettleStaleLedger(b.ctx, testDirectory, 15*time.Minute)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Equal(t, []string{"stale.example unknown", "young.example pending"}, b.ledgerOutcomes(t))

	// The token its Admit took stays taken.
	limits := issuing.Limits{CertsPerExactSet: issuing.Limit{Count: 1, Window: time.Hour}}
	b.spentBucket(t, testDirectory, "exact_set", "stale.example", limits.CertsPerExactSet, 1)
	admitted, refused, err := b.q.Admit(b.ctx, testDirectory, limits, b.admissions(t, false))
	require.NoError(t, err)
	require.Empty(t, admitted, "an order of unknown outcome no longer counts as a certificate")
	require.Len(t, refused, 1)

	require.NoError(t, b.q.SettleLedger(b.ctx, testDirectory, "11111111-1111-1111-1111-111111111111", issuing.LedgerFailed, limits))
	require.Equal(t, []string{"stale.example failed", "young.example pending"}, b.ledgerOutcomes(t))
}

// earlyDeadline is a context whose deadline comes before it is done: the server's
// statement_timeout (set from the deadline) then ends the lock's wait while the
// context still says it is not over, as happens when the deadline's timer runs late.
type earlyDeadline struct {
	context.Context
	at time.Time
}

func (c earlyDeadline) Deadline() (time.Time, bool) { return c.at, true }

// A wait for the ledger's lock that the server cancels at the caller's deadline
// (SQLSTATE 57014, a moment before the caller's context is done) is ErrLedgerBusy,
// not a database error. It used to pass through as "canceling statement due to
// statement timeout" (seen once in CI).
func TestAdmit_AStatementTimeoutAtTheDeadlineIsABusyLedger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	b.named(t, tn, "a.early.example")
	limits := issuing.Limits{OrdersPerAccount: issuing.Limit{Count: 10, Window: time.Hour}}
	as := b.admissions(t, false)
	release := b.holdLedgerLock(t)
	defer release()

	done, cancel := context.WithTimeout(b.ctx, 1500*time.Millisecond)
	defer cancel()
	ctx := earlyDeadline{Context: done, at: time.Now().Add(300 * time.Millisecond)}
	_, _, err := b.q.Admit(ctx, testDirectory, limits, as)
	require.ErrorIs(t, err, issuing.ErrLedgerBusy)
	require.Empty(t, b.ledgerOutcomes(t))
}
