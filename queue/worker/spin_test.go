package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// secondDirectory is the second CA's directory in the tests with two CAs.
const secondDirectory = "https://second.invalid/directory"

// updatesOfDomains is how many row updates proxy_domains has had, as the statistics
// collector counts them (flushed within a second of each transaction).
func (b *bundle) updatesOfDomains(t *testing.T) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'proxy_domains'`).Scan(&n))
	return n
}

// A renewal whose certificate came from the second CA, while the first's account-wide
// ledger pause is in force (its orders per account used up), and the first CA has
// issued for the name once before. The claim and the ledger decide "is this a renewal
// to the first CA" by one rule: it is not (the certificate is the second's), so the
// pause holds it back at the first and it is renewed where it was issued. Over three
// polls (6 s) proxy_domains sees a handful of updates. The claim passed it as a renewal exempt
// from the pause (the first had issued for the name), Admit counted it as a new order
// (not the first's certificate) and refused it, and the fill claimed it again at once:
// 10,197 updates of proxy_domains in 30 s, for as long as the pause lasts.
func TestWorker_TwoCAsTheClaimAndTheLedgerAgreeOnARenewalAndNothingSpins(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t))
	first, second := fakeissuer.New(10), fakeissuer.New(10)
	cert, err := second.Issue(context.Background(), issuing.Request{DomainID: id, Domain: name})
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at, issuer_directory)
VALUES ($1, $2, 'key', now() + interval '30 days', $3)`, name, cert.ChainPEM, secondDirectory)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `
INSERT INTO certworker_issued_names (directory, name) VALUES ($1, $3), ($2, $3)`,
		workertest.Directory, secondDirectory, name)
	require.NoError(t, err)
	// The first CA's orders per account are used up for the hour, and paused so.
	limits := issuing.Limits{OrdersPerAccount: issuing.Limit{Count: 2, Window: time.Hour}}
	_, err = b.pool.Exec(b.ctx, `
INSERT INTO certworker_buckets (directory, kind, key, tat) VALUES ($1, 'account', $1, now() + interval '1 hour')`,
		workertest.Directory)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `
INSERT INTO certworker_pauses (directory, scope, key, source, paused_until, reason, held_since)
VALUES ($1, 'ca', $1, 'ledger', now() + interval '1 hour', 'orders per account used up', now())`, workertest.Directory)
	require.NoError(t, err)

	before := b.updatesOfDomains(t)
	const poll = 2 * time.Second
	b.start(t, "w", worker.Config{Issuer: first, Limits: limits, Concurrency: 2, PollInterval: poll,
		Fallback: &worker.FallbackCA{Issuer: second, Directory: secondDirectory, After: time.Hour, Limits: limits}})
	b.waitStatus(t, id, "active", 30*time.Second)
	require.Equal(t, 0, first.Count(name), "the first CA was asked during its pause")
	require.Equal(t, 2, second.Count(name), "not renewed by the second CA, where it was issued (one call is the test's)")

	// A handful: the claim, the certificate's write, and what the triggers add; the
	// spin made hundreds a second. Three polls, each of which could start it again.
	deadline := time.Now().Add(3 * poll)
	for time.Now().Before(deadline) {
		require.Less(t, b.updatesOfDomains(t)-before, int64(20), "proxy_domains is being updated over and over")
		select {
		case <-time.After(time.Second):
		case <-b.ctx.Done():
		}
	}
}
