package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// history is the domain's events, oldest first, as "event/reason" (reason "-" for
// none), with their counts.
func (b *bundle) history(t *testing.T, id string) ([]string, []int) {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT event, COALESCE(reason, '-'), count FROM certworker_domain_events
WHERE domain_id = $1 ORDER BY id`, id)
	require.NoError(t, err)
	var events []string
	var counts []int
	var event, reason string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&event, &reason, &n}, func() error {
		events = append(events, event+"/"+reason)
		counts = append(counts, n)
		return nil
	})
	require.NoError(t, err)
	return events, counts
}

// sameTransaction requires that the domain's newest event was written by the
// transaction that last wrote its row: the xmin of both rows is that transaction's
// id. An event written in a transaction of its own, after the change, could be lost
// by a crash between the two, or written for a change that rolled back.
func (b *bundle) sameTransaction(t *testing.T, id, what string) {
	t.Helper()
	var row, event string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT xmin::text FROM proxy_domains WHERE id = $1`, id).Scan(&row))
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT xmin::text FROM certworker_domain_events
WHERE domain_id = $1 ORDER BY id DESC LIMIT 1`, id).Scan(&event))
	require.Equal(t, row, event, "%s: the event was not written in the transaction of the change", what)
}

// A domain's life, as the worker writes it: each event in the transaction of the
// change it records (xmin), the proxy's verify and retry recorded when the worker
// claims the domain next, and a second issuance recorded as a renewal.
func TestEvents_WrittenWithTheChangeTheyRecord(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	id := b.named(t, tenant, "life.example")

	c := b.claimOne(t, id)
	b.sameTransaction(t, id, "claim")
	_, err := b.q.MarkFailed(b.ctx, c, "urn:ietf:params:acme:error:unauthorized: 404 at the challenge")
	require.NoError(t, err)
	b.sameTransaction(t, id, "failure")

	queued, err := b.q.QueueForIssuance(b.ctx, id, tenant) // the proxy's retry
	require.NoError(t, err)
	require.True(t, queued)
	events, _ := b.history(t, id)
	require.Equal(t, []string{"verified/-", "claimed/-", "failed/validation_failed"}, events,
		"nothing is written inside the proxy's transaction")

	c = b.claimOne(t, id)
	b.sameTransaction(t, id, "claim after a retry")
	require.NoError(t, b.q.Wait(b.ctx, c, issuing.WaitingPrefix+"no such name; to be issued, point life.example at this proxy's addresses", "a1", queue.WaitCheckFirst))
	b.sameTransaction(t, id, "wait")
	require.NoError(t, b.q.Recheck(b.ctx, id, queue.WaitCheckFirst, queue.WaitCheckFirst, "a1", ""))
	require.NoError(t, b.q.Recheck(b.ctx, id, queue.WaitCheckFirst, queue.WaitCheckFirst, "a2", issuing.WaitingPrefix+"life.example resolves to 192.0.2.1; to be issued, point life.example at this proxy's addresses"))
	ended, err := b.q.EndWait(b.ctx, id)
	require.NoError(t, err)
	require.True(t, ended)

	_, err = b.q.ReturnHeld(b.ctx, testDirectory)
	require.NoError(t, err)
	c = b.claimOne(t, id)
	now := nowSecond()
	require.NoError(t, b.markActive(c, mintCertificate(t, "life.example", now.Add(-time.Hour), now.Add(90*24*time.Hour))))
	b.sameTransaction(t, id, "issuance")

	b.exec(t, `UPDATE proxy_domains SET ssl_status = 'pending', ssl_last_attempt_at = NULL WHERE id = $1`, id) // renewed early
	c = b.claimOne(t, id)
	require.NoError(t, b.markActive(c, mintCertificate(t, "life.example", now, now.Add(80*24*time.Hour))))

	events, counts := b.history(t, id)
	require.Equal(t, []string{
		"verified/-", "claimed/-", "failed/validation_failed",
		"retried/-", "claimed/-", "waiting_for_dns/dns_not_pointed",
		"claimed/-", "issued/-",
		"queued/-", "claimed/-", "renewed/-",
	}, events)
	require.Equal(t, 3, counts[5], "the wait checked twice more is one event, counted up")
	var message string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT message FROM certworker_domain_events
WHERE domain_id = $1 AND event = 'waiting_for_dns'`, id).Scan(&message))
	require.Contains(t, message, "resolves to 192.0.2.1", "a repeat carries the newest message")
	var tenants int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM certworker_domain_events
WHERE domain_id = $1 AND tenant_id <> $2`, id, tenant).Scan(&tenants))
	require.Zero(t, tenants, "every event carries the tenant")
}

// The failures and holds the worker writes, each with its reason code: a refusal no
// retry changes, a CA's rate limit (held, uncharged), the give-up at --max-attempts,
// a wait that outlived --dns-wait-max.
func TestEvents_FailuresAndHoldsCarryTheirReason(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	caa, held, last := b.named(t, tenant, "caa.example"), b.named(t, tenant, "held.example"), b.named(t, tenant, "last.example")
	b.exec(t, `UPDATE proxy_domains SET ssl_attempts = 9 WHERE id = $1`, last)
	claims, err := b.q.Claim(b.ctx, "test", testDirectory, 10)
	require.NoError(t, err)
	require.Len(t, claims, 3)
	for _, c := range claims {
		switch c.ID {
		case caa:
			require.NoError(t, b.q.MarkPermanent(b.ctx, c, "caa: the CAA records of caa.example allow only other.example"))
		case held:
			require.NoError(t, b.q.Hold(b.ctx, c, true, "rate_limited"))
			b.sameTransaction(t, held, "hold")
		case last:
			f, err := b.q.MarkFailed(b.ctx, c, "urn:ietf:params:acme:error:dns: NXDOMAIN")
			require.NoError(t, err)
			require.True(t, f.GaveUp)
		}
	}
	for id, want := range map[string]string{caa: "failed/caa_forbids", held: "held/rate_limited", last: "failed/too_many_failures"} {
		events, _ := b.history(t, id)
		require.Equal(t, want, events[len(events)-1])
	}
	require.Equal(t, "pending", b.status(t, held), "a hold is a hand-back")
}

// NOTIFY certworker_domain, payload the domain's id, comes with each event, once its
// transaction commits; an event of a transaction that rolls back is neither written
// nor notified.
func TestEvents_NotifyCertworkerDomainAfterCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	id := b.named(t, tenant, "notified.example")
	conn, err := pgx.Connect(b.ctx, b.dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(b.ctx, "LISTEN certworker_domain")
	require.NoError(t, err)

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `SELECT certworker_domain_event($1, $2, 'failed', NULL, NULL, now())`, id, tenant)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(b.ctx))
	events, _ := b.history(t, id)
	require.Empty(t, events, "an event of a transaction rolled back")

	// The claim writes its events (verified, claimed) without a notification: its
	// commit takes no notification lock the proxy's verifies would queue behind.
	b.claimOne(t, id)
	ctx, cancel := context.WithTimeout(b.ctx, 300*time.Millisecond)
	defer cancel()
	_, err = conn.WaitForNotification(ctx)
	require.Error(t, err, "the claim's transaction notified, or the rollback did")
	events, _ = b.history(t, id)
	require.NotEmpty(t, events, "the claim wrote no event")
	// The worker notifies once the claim has committed: one notification a domain.
	require.NoError(t, b.q.NotifyDomains(b.ctx, []string{id}))
	ctx, cancel = context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(ctx)
	require.NoError(t, err)
	require.Equal(t, "certworker_domain", n.Channel)
	require.Equal(t, id, n.Payload)
	// Another event, written with its change, notifies at its commit.
	_, err = b.pool.Exec(b.ctx, `SELECT certworker_domain_event($1, $2, 'failed', NULL, NULL, now())`, id, tenant)
	require.NoError(t, err)
	n, err = conn.WaitForNotification(ctx)
	require.NoError(t, err)
	require.Equal(t, id, n.Payload)
}

// The ledger's decision is in the history, in its own transaction: an admitted order
// is ordered, a refused one held (rate_limited), uncharged. Two orders of an account
// limit of one.
func TestEvents_TheLedgerRecordsOrderedAndHeld(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	b.named(t, tenant, "first.example")
	b.named(t, tenant, "second.example")
	limits := issuing.Limits{OrdersPerAccount: issuing.Limit{Count: 1, Window: time.Hour}}
	admitted, refused, err := b.q.Admit(b.ctx, testDirectory, limits, b.admissions(t, false))
	require.NoError(t, err)
	require.Len(t, admitted, 1)
	require.Len(t, refused, 1)
	events, _ := b.history(t, admitted[0].ID)
	require.Equal(t, "ordered/-", events[len(events)-1])
	var ledgerXmin, eventXmin string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT xmin::text FROM certworker_ledger WHERE domain_id = $1`, admitted[0].ID).Scan(&ledgerXmin))
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT xmin::text FROM certworker_domain_events WHERE domain_id = $1 AND event = 'ordered'`,
		admitted[0].ID).Scan(&eventXmin))
	require.Equal(t, ledgerXmin, eventXmin, "ordered is written with the ledger's row")
	events, _ = b.history(t, refused[0].Claim.ID)
	require.Equal(t, "held/rate_limited", events[len(events)-1])
	b.sameTransaction(t, refused[0].Claim.ID, "the ledger's hand-back")
}

// A domain the proxy takes out of certworker's hands (unverified, or given to another
// provider) gets its withdrawn event at the time of the change, from the worker's
// RecordWithdrawals in the statement that clears the stamp (xmin), with the domain's
// tenant; never inside the proxy's transaction, never for a domain with no history,
// never twice, and not after a newer event (verified again and claimed before the
// run). Guards against a withdrawal missing from the history the proxy shows and
// pushes, and against one recorded out of order or by the proxy's own write.
func TestEvents_AWithdrawalIsRecordedAtTheTimeOfTheChange(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	issue := func(name string) string {
		id := b.named(t, tenant, name)
		c := b.claimOne(t, id)
		now := nowSecond()
		require.NoError(t, b.markActive(c, mintCertificate(t, name, now.Add(-time.Hour), now.Add(90*24*time.Hour))))
		return id
	}
	issued, moved, again := issue("gone.example"), issue("moved.example"), issue("again.example")
	never := b.named(t, tenant, "never.example")

	b.exec(t, `UPDATE proxy_domains SET verification_status = 'failed' WHERE id = ANY($1::uuid[])`, []string{issued, never, again})
	b.exec(t, `UPDATE proxy_domains SET ssl_provider = 'manual' WHERE id = $1`, moved)
	events, _ := b.history(t, issued)
	require.Equal(t, []string{"verified/-", "claimed/-", "issued/-"}, events, "nothing is written inside the proxy's transaction")
	stamp := func(id string) *time.Time {
		var at *time.Time
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ssl_withdrawn_at FROM proxy_domains WHERE id = $1`, id).Scan(&at))
		return at
	}
	withdrawnAt := stamp(issued)
	require.NotNil(t, withdrawnAt, "the trigger stamps the withdrawal")
	require.NotNil(t, stamp(moved), "another provider is a withdrawal too")

	// again.example is verified again and claimed before the worker's run.
	b.exec(t, `UPDATE proxy_domains SET verification_status = 'verified', ssl_status = 'pending', ssl_last_attempt_at = NULL WHERE id = $1`, again)
	b.claimOne(t, again)

	n, err := b.q.RecordWithdrawals(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	b.sameTransaction(t, issued, "withdrawal")
	events, _ = b.history(t, issued)
	require.Equal(t, []string{"verified/-", "claimed/-", "issued/-", "withdrawn/-"}, events)
	var at time.Time
	var eventTenant string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT at, tenant_id::text FROM certworker_domain_events
WHERE domain_id = $1 AND event = 'withdrawn'`, issued).Scan(&at, &eventTenant))
	require.True(t, at.Equal(*withdrawnAt), "recorded at the time of the change: %s, not %s", at, *withdrawnAt)
	require.Equal(t, tenant, eventTenant)
	events, _ = b.history(t, moved)
	require.Equal(t, "withdrawn/-", events[len(events)-1])
	events, _ = b.history(t, never)
	require.Empty(t, events, "a domain certworker never had has no history to add to")
	events, _ = b.history(t, again)
	require.NotContains(t, events, "withdrawn/-", "a withdrawal older than the history's newest event")
	for _, id := range []string{issued, moved, never, again} {
		require.Nil(t, stamp(id), "the stamp is cleared")
	}

	n, err = b.q.RecordWithdrawals(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "recorded once")
}
