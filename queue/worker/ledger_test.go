package worker_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue/worker"
)

func (b *bundle) ledger(t *testing.T) []string {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT name || ' ' || outcome FROM certworker_ledger ORDER BY id`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// loseLedgerCommit runs the worker's statements on a real pool and loses the answer
// of the first COMMIT of a transaction that recorded orders in the ledger: the
// transaction commits, and the worker is told the connection broke.
type loseLedgerCommit struct {
	*pgxpool.Pool
	lost atomic.Bool
}

func (l *loseLedgerCommit) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := l.Pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &loseCommitTx{Tx: tx, l: l}, nil
}

type loseCommitTx struct {
	pgx.Tx
	l        *loseLedgerCommit
	recorded bool
}

func (t *loseCommitTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, q := range b.QueuedQueries {
		if strings.Contains(q.SQL, "INSERT INTO certworker_ledger") {
			t.recorded = true
		}
	}
	return t.Tx.SendBatch(ctx, b)
}

func (t *loseCommitTx) Commit(ctx context.Context) error {
	if err := t.Tx.Commit(ctx); err != nil {
		return err
	}
	if t.recorded && t.l.lost.CompareAndSwap(false, true) {
		return errConnectionLost
	}
	return nil
}

// An Admit whose COMMIT went through while its answer was lost leaves no row pending:
// the claims are handed back, uncharged, and their ledger rows settled as not sent
// (no order was placed); the domain is then ordered once. The rows stayed pending for
// as long as the window (a week), counted as certificates in flight: five of them
// held a name back for the week.
func TestWorker_AnAdmitWhoseCommitAnswerWasLostLeavesNoRowPending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	db := &loseLedgerCommit{Pool: b.pool}
	id, name := b.domain(t, b.tenant(t))
	in := b.start(t, "w", worker.Config{DB: db, Issuer: fake, Limits: ledgerLimits, Concurrency: 1, PollInterval: time.Hour})
	b.waitStatus(t, id, "active", 20*time.Second)
	require.True(t, db.lost.Load(), "no COMMIT answer was lost: the test proves nothing")
	workertest.Eventually(t, 10*time.Second, "the issued order to be settled", func() bool {
		return len(b.ledger(t)) == 2 && b.ledger(t)[1] == name+" issued"
	})
	require.Equal(t, []string{name + " not_sent", name + " issued"}, b.ledger(t))
	require.Equal(t, 1, fake.Count(name))
	require.Zero(t, b.row(t, id).Attempts)
	require.Equal(t, 1.0, in.Metric(t, "certworker_issuance_total", "released_untracked"))
}

// A certificate the CA issued counts as issued whatever became of the claim: here the
// claim is taken while the CA issues, so the certificate is not stored, yet the CA
// counted it (five a week per name). It was recorded as a failure, which freed the
// slot it holds at the CA; and the name is known as one the CA issued for.
func TestWorker_ACertificateTheCAIssuedCountsAsIssuedWhenItsClaimWasLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	id, name := b.domain(t, b.tenant(t))
	fake.Fail = func(string, int) error {
		// Taken as an instance that reclaimed and claimed the row would take it,
		// while the order is at the CA.
		_, err := b.pool.Exec(context.Background(), `
UPDATE proxy_domains SET ssl_claim_token = gen_random_uuid(), ssl_claimed_by = 'thief' WHERE id = $1`, id)
		return err
	}
	in := b.start(t, "w", worker.Config{Issuer: fake, Limits: ledgerLimits, Concurrency: 1, PollInterval: time.Hour})
	in.WaitForLog(t, "result dropped: the claim was lost to another instance", 1, 10*time.Second)
	workertest.Eventually(t, 10*time.Second, "the order to be settled", func() bool {
		return len(b.ledger(t)) == 1 && !strings.HasSuffix(b.ledger(t)[0], " pending")
	})
	require.Equal(t, []string{name + " issued"}, b.ledger(t))
	var known int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM certworker_issued_names WHERE name = $1`, name).Scan(&known))
	require.Equal(t, 1, known)
}

// The ledger's orders still pending after an order's longest life (--order-timeout
// and a margin), which their instance died before settling, are recorded as unknown
// by the maintenance of any instance; a younger one is left pending.
func TestWorker_OrdersPendingLongerThanAnyOrderLivesAreSettled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO certworker_ledger (at, directory, name, registered_domain, outcome)
VALUES (now() - interval '15 minutes', $1, 'died.example', 'died.example', 'pending'),
       (now(), $1, 'running.example', 'running.example', 'pending')`, workertest.Directory)
	require.NoError(t, err)
	in := b.start(t, "w", worker.Config{Issuer: fakeissuer.New(10), Limits: ledgerLimits, PollInterval: time.Hour,
		OrderTimeout: 5 * time.Minute})
	in.WaitForLog(t, "ledger rows of orders that ended unrecorded; counted as the CA may have counted them", 1, 10*time.Second)
	require.Equal(t, []string{"died.example unknown", "running.example pending"}, b.ledger(t))
}
