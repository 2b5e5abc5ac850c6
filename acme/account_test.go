package acme_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue/issuing"
)

// registeredAccounts is how many stored accounts the CA registered: a row with an empty
// uri holds a key reserved for an account that is not registered yet.
func registeredAccounts(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM certworker_acme_accounts WHERE uri <> ''`).Scan(&n))
	return n
}

// No transaction of ours waits on the CA: while the CA holds the registration of the
// account unanswered, no session of the issuer is in a transaction and no advisory
// lock is held. The registration held a transaction and an advisory lock across the
// call, so an instance cut off mid-call kept both for as long as the server kept its
// session, and every other instance's first order waited behind them. The key stored
// before the call is the one registered when the CA answers: one account at the CA.
func TestAccount_RegistrationHoldsNoTransactionWhileTheCAAnswers(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	front := pebbletest.NewFront(t, b.ca)
	front.Add(pebbletest.Rule{Step: pebbletest.StepNewAccount, Times: 1, Answer: pebbletest.Answer{Stall: 5 * time.Second}})
	iss := newIssuer(t, b.pool, nil, frontConfig(b, front))

	done := make(chan error, 1)
	go func() {
		_, err := iss.Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: randomName("r")})
		done <- err
	}()
	require.Eventually(t, func() bool { return front.Answered()[pebbletest.StepNewAccount] == 1 },
		10*time.Second, 10*time.Millisecond, "the registration never reached the CA")
	var inTransaction, advisory int
	require.NoError(t, b.pool.QueryRow(context.Background(), `
SELECT (SELECT count(*) FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL),
       (SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
        WHERE l.locktype = 'advisory' AND d.datname = current_database())`).Scan(&inTransaction, &advisory))
	require.Zero(t, inTransaction, "a transaction is open while the CA is asked")
	require.Zero(t, advisory, "an advisory lock is held while the CA is asked")
	require.Error(t, <-done, "the stalled registration")

	front.Clear()
	_, err := iss.Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: randomName("r")})
	require.NoError(t, err)
	require.Equal(t, 1, countRows(t, b.pool, "certworker_acme_accounts"))
	require.Equal(t, 1, registeredAccounts(t, b.pool))
	require.Equal(t, 1, b.ca.NewAccounts())
}
