package queue_test

import (
	"context"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

func TestClaim_FreshPendingDomainIsClaimed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "pending", 0, nil)
	require.True(t, b.claimsInclude(t, id), "a verified ACME domain with no attempts should be claimed")
	require.Equal(t, "provisioning", b.status(t, id), "claiming must take the row")
}

func TestClaim_DomainThatFailedRecentlyWaits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// One failure, ten seconds ago. The backoff after one failure is two minutes.
	id, _ := b.domain(t, b.tenant(t), "pending", 1, ago(10))
	require.False(t, b.claimsInclude(t, id), "a domain inside its backoff window should not be claimed")
}

// A row whose backoff has run out is claimed again: the backoff is judged against the
// previous attempt, not against the claim's own stamp of ssl_last_attempt_at.
func TestClaim_DomainWhoseBackoffHasElapsedIsClaimedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "pending", 1, ago(3600))
	require.True(t, b.claimsInclude(t, id), "a domain past its backoff window must be retried")
}

func TestClaim_BackoffGrowsWithAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	// Four failures: 60 * 2^4 = 16 minutes. Ten minutes ago is too soon; twenty is due.
	tooSoon, _ := b.domain(t, tn, "pending", 4, ago(10*60))
	due, _ := b.domain(t, tn, "pending", 4, ago(20*60))
	claimed := b.drain(t)
	require.Contains(t, claimed, due, "a domain past its grown backoff must be retried")
	require.NotContains(t, claimed, tooSoon, "the backoff window must grow with the attempt count")
}

func TestClaim_BackoffIsCapped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Nine failures. Uncapped that would be 60 * 2^9 = 8.5 hours; the cap is four,
	// so five hours ago is due.
	id, _ := b.domain(t, b.tenant(t), "pending", 9, ago(5*60*60))
	require.True(t, b.claimsInclude(t, id), "the cap must bind, or a domain waits far longer than intended")
}

func TestClaim_DomainAtTheAttemptLimitIsLeftAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "pending", 10, ago(24*60*60))
	require.False(t, b.claimsInclude(t, id), "a domain at the attempt limit must not be picked up again without a retry")
}

// A hand-edited row can hold a negative count: it must count as 0 (due after one
// base period), not make the SQL compute a fraction of a second, nor error.
func TestClaim_NegativeAttemptsCountAsZero(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	recent, _ := b.domain(t, tn, "pending", -5, ago(30))
	old, _ := b.domain(t, tn, "pending", -2147483648, ago(61))
	claimed := b.drain(t)
	require.NotContains(t, claimed, recent, "a negative count made the backoff shorter than the base")
	require.Contains(t, claimed, old)
}

// A count far past the limit must not overflow the SQL's power() either, whatever
// order PostgreSQL evaluates the conditions in.
func TestClaim_HugeAttemptCountDoesNotBreakTheQuery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	b.domain(t, tn, "pending", 2147483647, ago(60))
	fresh, _ := b.domain(t, tn, "pending", 0, nil)
	require.Equal(t, []string{fresh}, b.drain(t))
}

func TestClaim_OnlyPendingAcmeDomainsAreClaimed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	active, _ := b.domain(t, tn, "active", 0, nil)
	failed, _ := b.domain(t, tn, "failed", 0, nil)
	provisioning, _ := b.domain(t, tn, "provisioning", 0, nil)
	manual := b.insert(t, tn, "verified", "pending", "manual")
	unverified := b.insert(t, tn, "pending", "pending", "acme")
	claimed := b.drain(t)
	for id, why := range map[string]string{
		active: "already active", failed: "given up on", provisioning: "already being worked on",
		manual: "not an ACME domain", unverified: "not verified",
	} {
		require.NotContains(t, claimed, id, "claimed a domain that is %s", why)
	}
}

// Claiming flips the status inside the same statement, so a second claim cannot see
// the row. Without that, two instances would each place an order and spend two of the
// CA's rate-limited slots for one certificate.
func TestClaim_TwoWorkersDoNotClaimTheSameDomain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "pending", 0, nil)
	first, err := b.q.Claim(b.ctx, "one", testDirectory, 1)
	require.NoError(t, err)
	require.Len(t, first, 1)
	require.NotContains(t, b.drain(t), id, "the same domain was claimed twice")
}

// The same, under real concurrency: eight claimers racing over 200 due domains each
// get distinct rows, and together get all of them.
func TestClaim_ConcurrentClaimersPartitionTheQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
SELECT $1, 'c' || g || '.example', 'verified', 'tok', 'pending', 'acme' FROM generate_series(1, 200) g`, tn)
	require.NoError(t, err)
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for {
				claims, err := b.q.Claim(context.Background(), "w", testDirectory, 1+w%3)
				if err != nil {
					t.Error(err)
					return
				}
				if len(claims) == 0 {
					return
				}
				mu.Lock()
				for _, c := range claims {
					seen[c.ID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Len(t, seen, 200)
	for id, n := range seen {
		require.Equal(t, 1, n, "domain %s claimed %d times", id, n)
	}
}

// The Go curve (used for logs, status and the timer) and the SQL curve the claim
// runs must agree, or a domain is reported due when the claim will not take it.
// Checked against the claim statement itself, not a copy of its SQL: for every attempt
// count, a row whose backoff ended two seconds ago is claimed and one whose backoff
// ends in two seconds is not. The rows are written and claimed in one transaction, so
// "ago" and the claim's "now" are the same now(), however long the machine takes
// between them (beside a CPU hog the inserts took more than the two seconds, and a
// row inserted first was claimed at the end of its backoff).
func TestBackoff_GoAndTheClaimAgree(t *testing.T) {
	t.Parallel()
	for _, cfg := range []issuing.Config{
		{RetryBase: time.Minute, RetryMax: 4 * time.Hour, MaxAttempts: math.MaxInt32, Lease: time.Minute},
		{RetryBase: 3 * time.Second, RetryMax: 10 * time.Second, MaxAttempts: math.MaxInt32, Lease: time.Minute},
	} {
		b := setup(t)
		tn := b.tenant(t)
		tx, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		q := queue.New(tx, cfg)
		insert := func(n int, secsAgo time.Duration) string {
			var id string
			require.NoError(t, tx.QueryRow(b.ctx, `
INSERT INTO proxy_domains
    (tenant_id, domain, verification_status, verification_method, verification_token,
     ssl_status, ssl_provider, ssl_attempts, ssl_last_attempt_at)
VALUES ($1, 'd-' || gen_random_uuid() || '.example', 'verified', 'dns', 'tok', 'pending', 'acme', $2,
    now() - make_interval(secs => $3::bigint))
RETURNING id::text`, tn, n, int64(secsAgo/time.Second)).Scan(&id))
			return id
		}
		due, early := map[string]int{}, map[string]int{}
		for _, n := range []int{-2147483648, -1, 0, 1, 2, 3, 4, 5, 8, 12, 13, 20, 62, 63, 100, 2147483646} {
			wait := cfg.Backoff(n)
			due[insert(n, wait+2*time.Second)] = n
			early[insert(n, wait-2*time.Second)] = n
		}
		claims, err := q.Claim(b.ctx, "test", testDirectory, 1000)
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(b.ctx))
		claimed := map[string]bool{}
		for _, c := range claims {
			claimed[c.ID] = true
		}
		for id, n := range due {
			require.True(t, claimed[id], "attempts %d: not claimed %s after Go's backoff %s", n, 2*time.Second, cfg.Backoff(n))
		}
		for id, n := range early {
			require.False(t, claimed[id], "attempts %d: claimed %s before Go's backoff %s ends", n, 2*time.Second, cfg.Backoff(n))
		}
	}
}

// The claim must not scan active rows: with 100,000 domains, nearly all active, the
// plan reads the claimable set through its partial index. With a second CA the
// routed claim still reads the rows in line through their index
// (proxy_domains_line_idx), in order, and does not scan the table either: the
// routing is looked up for the rows it reads (the pauses' key, proxy_certificates'
// for a renewal held back), not for the queue. Both plans are read off one database,
// filled once.
func TestClaim_UsesThePartialIndexAt100kDomains(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
SELECT $1, 'bulk' || g || '.example', 'verified', 'tok',
       CASE WHEN g % 1000 = 0 THEN 'pending' ELSE 'active' END, 'acme'
FROM generate_series(1, 100000) g`, tn)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `ANALYZE proxy_domains`)
	require.NoError(t, err)
	plan := b.explainClaim(t)
	require.Contains(t, plan, "proxy_domains_line_idx", "the claim does not use its index:\n%s", plan)
	require.NotContains(t, plan, "Seq Scan on proxy_domains", "the claim scans the table:\n%s", plan)

	plan = b.explain(t, queue.ClaimRoutedSQLForTest, 10, 60.0, 14400.0, "explain", 60.0, 4,
		testDirectory, secondDirectory, 600.0, 1, 3, 16)
	require.Contains(t, plan, "proxy_domains_line_idx", "the routed claim does not use the line's index:\n%s", plan)
	require.NotContains(t, plan, "Seq Scan on proxy_domains", "the routed claim scans the table:\n%s", plan)
}

func (b *bundle) explainClaim(t *testing.T) string {
	t.Helper()
	return b.explain(t, queue.ClaimSQLForTest, 10, 60.0, 14400.0, "explain", 60.0, 4, testDirectory, 1, 3, 16)
}

// explain is the plan EXPLAIN gives for sql with args, one line of it a line.
func (b *bundle) explain(t *testing.T, sql string, args ...any) string {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `EXPLAIN `+sql, args...)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return strings.Join(lines, "\n")
}
