package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

func TestMain(m *testing.M) {
	// The benchmarks read where the server's time went.
	pgtest.Settings = append(pgtest.Settings, "shared_preload_libraries=pg_stat_statements",
		// The wake benchmark measures from each verify's commit too.
		"track_commit_timestamp=on")
	pgtest.Main(m)
}

// bundle is one test's database.
type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	dsn  string
}

func setup(t testing.TB) *bundle {
	t.Helper()
	pool, dsn := pgtest.NewPool(t)
	return &bundle{ctx: context.Background(), pool: pool, dsn: dsn}
}

// workerPool is a pool on the test's database with a worker's sessions for lease
// (queue.WorkerSession, as workertest's pools), closed when the test ends. A faultDB in
// front of a worker's statements wraps one, so that they keep the server-side bounds
// and the deadline grace they have in production; the test's own pool (b.pool) has
// neither.
func (b *bundle) workerPool(t testing.TB, lease time.Duration) *pgxpool.Pool {
	t.Helper()
	pool, err := queue.NewPoolWith(b.ctx, b.dsn, queue.WorkerSession(lease))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// start runs a worker on the test's database.
func (b *bundle) start(t testing.TB, name string, cfg worker.Config) *workertest.Instance {
	t.Helper()
	return workertest.Start(t, b.dsn, name, cfg)
}

func (b *bundle) tenant(t testing.TB) string {
	t.Helper()
	return pgtest.Tenant(t, b.pool)
}

// domain inserts a verified, pending ACME domain (claimable at once) and returns its
// id and name.
func (b *bundle) domain(t testing.TB, tenant string) (string, string) {
	t.Helper()
	name := fmt.Sprintf("d-%s.example", uuid.NewString()[:8])
	return b.named(t, tenant, name), name
}

func (b *bundle) named(t testing.TB, tenant, name string) string {
	t.Helper()
	return pgtest.Domain(t, b.pool, tenant, name)
}

// unverified inserts a pending ACME domain that is not verified yet.
func (b *bundle) unverified(t testing.TB, tenant string) (string, string) {
	t.Helper()
	name := fmt.Sprintf("u-%s.example", uuid.NewString()[:8])
	var id string
	require.NoError(t, b.pool.QueryRow(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_token, ssl_provider)
VALUES ($1, $2, 'tok', 'acme') RETURNING id::text`, tenant, name).Scan(&id))
	return id, name
}

// row is what the tests read of a domain.
type row struct {
	Status   string
	Attempts int
	Error    *string
	Token    *string
	Owner    *string
}

func (b *bundle) row(t testing.TB, id string) row {
	t.Helper()
	var r row
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT ssl_status, ssl_attempts, ssl_error, ssl_claim_token::text, ssl_claimed_by FROM proxy_domains WHERE id = $1`, id).
		Scan(&r.Status, &r.Attempts, &r.Error, &r.Token, &r.Owner))
	return r
}

func (b *bundle) status(t testing.TB, id string) string {
	t.Helper()
	return b.row(t, id).Status
}

func (b *bundle) waitStatus(t testing.TB, id, status string, timeout time.Duration) {
	t.Helper()
	workertest.Eventually(t, timeout, "the domain to become "+status, func() bool { return b.status(t, id) == status })
}

// drain claims everything due, as another instance would.
func (b *bundle) drain(t testing.TB) []string {
	t.Helper()
	q := queue.New(b.pool, issuing.DefaultConfig())
	var ids []string
	for {
		claims, err := q.Claim(b.ctx, "test", workertest.Directory, 10)
		require.NoError(t, err)
		if len(claims) == 0 {
			return ids
		}
		for _, c := range claims {
			ids = append(ids, c.ID)
		}
	}
}
