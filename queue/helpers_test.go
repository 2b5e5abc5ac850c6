package queue_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testDirectory is the ACME directory the tests' claims are made for: the key of a
// pause of the whole CA.
const testDirectory = "https://ca.invalid/directory"

// bundle is one test's database and queue. Each test has a database of its own, so
// the claim query is tested as it runs in production (global, any tenant) while the
// tests run in parallel.
type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	dsn  string
	q    *queue.Queue
}

func setup(t *testing.T) *bundle {
	t.Helper()
	pool, dsn := pgtest.NewPool(t)
	return &bundle{ctx: context.Background(), pool: pool, dsn: dsn, q: queue.New(pool, issuing.DefaultConfig())}
}

// tenant inserts a tenant to hang domains off.
func (b *bundle) tenant(t *testing.T) string {
	t.Helper()
	return pgtest.Tenant(t, b.pool)
}

// domain inserts a verified ACME domain with a given attempt history: attempts, and
// a last attempt secsAgo seconds ago (nil: never tried).
func (b *bundle) domain(t *testing.T, tenant, status string, attempts int, secsAgo *int) (string, string) {
	t.Helper()
	name := fmt.Sprintf("d-%s.example", uuid.NewString())
	var id string
	require.NoError(t, b.pool.QueryRow(b.ctx, `
INSERT INTO proxy_domains
    (tenant_id, domain, verification_status, verification_method, verification_token,
     ssl_status, ssl_provider, ssl_attempts, ssl_last_attempt_at)
VALUES ($1, $2, 'verified', 'dns', 'tok', $3, 'acme', $4,
    CASE WHEN $5::bigint IS NULL THEN NULL ELSE now() - make_interval(secs => $5::bigint) END)
RETURNING id::text`, tenant, name, status, attempts, secsAgo).Scan(&id))
	return id, name
}

// insert inserts a domain with the given columns verbatim.
func (b *bundle) insert(t *testing.T, tenant, verification, status, provider string) string {
	t.Helper()
	var id string
	require.NoError(t, b.pool.QueryRow(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
VALUES ($1, $2, $3, 'tok', $4, $5) RETURNING id::text`,
		tenant, fmt.Sprintf("x-%s.example", uuid.NewString()), verification, status, provider).Scan(&id))
	return id
}

func ago(secs int) *int { return &secs }

// drain claims everything due and returns the claimed ids.
func (b *bundle) drain(t *testing.T) []string {
	t.Helper()
	var ids []string
	for {
		claims, err := b.q.Claim(b.ctx, "test", testDirectory, 1)
		require.NoError(t, err)
		if len(claims) == 0 {
			return ids
		}
		for _, c := range claims {
			ids = append(ids, c.ID)
		}
	}
}

func (b *bundle) claimsInclude(t *testing.T, id string) bool {
	t.Helper()
	return slices.Contains(b.drain(t), id)
}

func (b *bundle) status(t *testing.T, id string) string {
	t.Helper()
	var s string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ssl_status FROM proxy_domains WHERE id = $1`, id).Scan(&s))
	return s
}

// claimOne claims the one due domain, which must be id.
func (b *bundle) claimOne(t *testing.T, id string) issuing.Claim {
	t.Helper()
	claims, err := b.q.Claim(b.ctx, "test", testDirectory, 10)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	require.Equal(t, id, claims[0].ID)
	return claims[0]
}

// markActive stores cert under claim c, for tests that do not look at the renewal delay.
func (b *bundle) markActive(c issuing.Claim, cert *issuing.Certificate) error {
	_, err := b.q.MarkActive(b.ctx, c, cert)
	return err
}

// named inserts a verified, pending ACME domain with the given name.
func (b *bundle) named(t *testing.T, tenant, name string) string {
	t.Helper()
	return pgtest.Domain(t, b.pool, tenant, name)
}
