package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// The worker's own orders write the domain's history: an issuance is verified,
// claimed, issued; a CA's rate limit is a hold with its reason code (the hand-back
// carries it), uncharged. Guards against a path of the worker that changes a domain
// without recording it.
func TestWorker_OrdersWriteTheDomainsHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	fake.Fail = func(domain string, _ int) error {
		if domain == "limited.example" {
			return &issuing.RateLimitError{RetryAfter: time.Hour, Detail: "too many certificates", Scope: issuing.ScopeDomain}
		}
		return nil
	}
	tn := b.tenant(t)
	issued, limited := b.named(t, tn, "issued.example"), b.named(t, tn, "limited.example")
	b.start(t, "w", worker.Config{Issuer: fake, Concurrency: 2, PollInterval: time.Hour})
	b.waitStatus(t, issued, "active", 10*time.Second)
	history := func(id string) []string {
		rows, err := b.pool.Query(b.ctx, `SELECT event || '/' || COALESCE(reason, '-') FROM certworker_domain_events
WHERE domain_id = $1 ORDER BY id`, id)
		require.NoError(t, err)
		defer rows.Close()
		var out []string
		for rows.Next() {
			var s string
			require.NoError(t, rows.Scan(&s))
			out = append(out, s)
		}
		return out
	}
	workertest.Eventually(t, 10*time.Second, "the hold recorded", func() bool { return len(history(limited)) == 3 })
	require.Equal(t, []string{"verified/-", "claimed/-", "issued/-"}, history(issued))
	require.Equal(t, []string{"verified/-", "claimed/-", "held/rate_limited"}, history(limited))
	require.Zero(t, b.row(t, limited).Attempts, "a hold is not charged")
}

// The worker's maintenance records a withdrawal: an issued domain the proxy unverifies
// gets its withdrawn event with no claim or order, within the maintenance's interval.
// Guards against a withdrawal the worker's loops never record.
func TestWorker_MaintenanceRecordsAWithdrawal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	id := b.named(t, tn, "withdrawn.example")
	b.start(t, "w", worker.Config{Issuer: fakeissuer.New(10), Concurrency: 1, PollInterval: 200 * time.Millisecond})
	b.waitStatus(t, id, "active", 10*time.Second)
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET verification_status = 'failed' WHERE id = $1`, id)
	require.NoError(t, err)
	workertest.Eventually(t, 10*time.Second, "the withdrawal recorded", func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM certworker_domain_events
WHERE domain_id = $1 AND event = 'withdrawn'`, id).Scan(&n))
		return n == 1
	})
}

// A claim's events are announced on certworker_domain once the claim has committed,
// while the order is still running: the proxy hears of the claimed event before the
// issued one. Guards against claimed rows the worker never announces.
func TestWorker_AClaimIsAnnouncedOnCertworkerDomain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn, err := pgx.Connect(b.ctx, b.dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(b.ctx, "LISTEN certworker_domain")
	require.NoError(t, err)
	fake := fakeissuer.New(10)
	fake.Delay = time.Hour // the order stays in flight: no issued event
	tn := b.tenant(t)
	id := b.named(t, tn, "announced.example")
	b.start(t, "w", worker.Config{Issuer: fake, Concurrency: 1, PollInterval: time.Hour, ShutdownGrace: time.Millisecond})
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(ctx)
	require.NoError(t, err, "no notification for the claim")
	require.Equal(t, id, n.Payload)
	require.Equal(t, "provisioning", b.status(t, id), "the notification came from the claim, not the order's end")
	var claimed int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM certworker_domain_events
WHERE domain_id = $1 AND event = 'claimed'`, id).Scan(&claimed))
	require.Equal(t, 1, claimed)
}
