package worker_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue/worker"
)

// Tenant A verifies 2,000 domains in one statement; a second later tenant B verifies
// one. B's domain is among the next --concurrency claims, on one instance and on
// three, not behind A's backlog. Counted on the database: A's domains claimed after
// B's verify was committed and before B's claim.
func TestWorker_ALateTenantIsAmongTheNextClaims(t *testing.T) {
	t.Parallel()
	const concurrency = 4
	for _, instances := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d instances", instances), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			fake := fakeissuer.New(1)
			fake.Delay = 20 * time.Millisecond
			for i := range instances {
				b.start(t, fmt.Sprint("w", i), worker.Config{Issuer: fake, Concurrency: concurrency, PollInterval: time.Hour})
			}
			a, other := b.tenant(t), b.tenant(t)
			_, err := b.pool.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_token, ssl_provider)
SELECT $1, 'a' || g || '.example', 'tok', 'acme' FROM generate_series(1, 2000) g`, a)
			require.NoError(t, err)
			_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET verification_status = 'verified' WHERE tenant_id = $1`, a)
			require.NoError(t, err)
			time.Sleep(time.Second)
			id, _ := b.unverified(t, other)
			_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET verification_status = 'verified' WHERE id = $1`, id)
			require.NoError(t, err)
			// B's verify has committed and is visible to every claim that takes its
			// snapshot from now on. A claim stamped before could not see B and says
			// nothing about the order of service. A claim is stamped as it writes its
			// rows, after its snapshot: one in flight now may be stamped later and
			// still not see B, and it takes at most its instance's free slots, so B is
			// claimed within --concurrency claims of A's stamped from now on with one
			// instance. With three, each may have a claim in flight, and a claim that
			// found B locked by the one taking it may be stamped just before it: held
			// to --concurrency, the test failed beside a CPU hog (5 rows). Each such
			// claim takes only the slots freed since its instance's last claim, so the
			// bound is the instances' slots; a worker that served A's backlog first
			// would claim hundreds.
			var visible time.Time
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT now()`).Scan(&visible))
			workertest.Eventually(t, 20*time.Second, "B's claim", func() bool { return b.status(t, id) != "pending" })
			var before, racing, backlog int
			require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT count(*) FILTER (WHERE a.ssl_last_attempt_at >= $3 AND a.ssl_last_attempt_at < bd.ssl_last_attempt_at),
       count(*) FILTER (WHERE a.ssl_last_attempt_at > bd.ssl_queued_at AND a.ssl_last_attempt_at < $3),
       count(*) FILTER (WHERE a.ssl_status = 'pending')
FROM proxy_domains a, proxy_domains bd WHERE a.tenant_id = $1 AND bd.id = $2`, a, id, visible).Scan(&before, &racing, &backlog))
			t.Logf("%d of A's domains claimed after B's verify was visible and before B's claim (%d more while it committed); %d of A's still queued then",
				before, racing, backlog)
			require.Positive(t, backlog, "A's backlog was drained before B arrived: the test shows nothing")
			require.LessOrEqual(t, before, instances*concurrency, "B waited behind A's backlog")
		})
	}
}

// During a mass revocation, 1,000 urgent renewals of tenant A are queued (their
// renewal windows moved to "now"); a second later tenant B verifies one domain. B's
// first issuance is among the next --concurrency claims: while first issuances are
// due, a quarter of each instance's slots, rounded up, goes to them whatever the
// urgent renewals ahead.
func TestWorker_ANewcomerDuringAMassRenewalIsAmongTheNextClaims(t *testing.T) {
	t.Parallel()
	const concurrency = 4
	b := setup(t)
	fake := fakeissuer.New(1)
	fake.Delay = 20 * time.Millisecond
	b.start(t, "w", worker.Config{Issuer: fake, Concurrency: concurrency, PollInterval: time.Hour})
	a, other := b.tenant(t), b.tenant(t)
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider, ssl_renew_by)
SELECT $1, 'r' || g || '.example', 'verified', 'tok', 'active', 'acme', now() - make_interval(mins => g)
FROM generate_series(1, 1000) g`, a)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_status = 'pending' WHERE tenant_id = $1`, a)
	require.NoError(t, err)
	time.Sleep(time.Second)
	id, _ := b.unverified(t, other)
	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET verification_status = 'verified' WHERE id = $1`, id)
	require.NoError(t, err)
	// As in the test above: a claim in flight now cannot see B, and is stamped later.
	var visible time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT now()`).Scan(&visible))
	workertest.Eventually(t, 20*time.Second, "B's claim", func() bool { return b.status(t, id) != "pending" })
	var before, backlog int
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT count(*) FILTER (WHERE a.ssl_last_attempt_at >= $3 AND a.ssl_last_attempt_at < bd.ssl_last_attempt_at),
       count(*) FILTER (WHERE a.ssl_status = 'pending')
FROM proxy_domains a, proxy_domains bd WHERE a.tenant_id = $1 AND bd.id = $2`, a, id, visible).Scan(&before, &backlog))
	t.Logf("%d of A's renewals claimed after B's verify was visible and before B's claim; %d still queued then", before, backlog)
	require.Positive(t, backlog, "A's renewals were all done before B arrived: the test shows nothing")
	require.LessOrEqual(t, before, concurrency, "B waited behind the urgent renewals")
}
