package queue_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/legacydb"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/migrations"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// The worker's maintenance passes on the database they will really meet: the proxy's
// as the Rust worker leaves it (20,000 domains here, twenty of each pass's batches;
// certificates without renewal times, some with a NULL expires_at, odd rows, the old
// worker's claims), once migrated. Every pass goes through, deals with what it owns,
// and a second round finds nothing left.
func TestPasses_OnTheProxysMigratedDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const domains = 20_000
	url := legacydb.New(t, pgtest.Shared(t), legacydb.Options{Domains: domains, Tenants: domains / 100})
	db, err := sql.Open("pgx", url)
	require.NoError(t, err)
	_, err = migrations.Up(ctx, db, migrations.Options{})
	db.Close()
	require.NoError(t, err)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	b := &bundle{ctx: ctx, pool: pool, dsn: url, q: queue.New(pool, issuing.DefaultConfig())}
	count := func(sql string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, sql).Scan(&n))
		return n
	}
	const dueSQL = `SELECT count(*) FROM proxy_domains d JOIN proxy_certificates c ON c.domain = d.domain
WHERE d.ssl_status = 'active' AND d.ssl_provider = 'acme' AND d.verification_status = 'verified'
  AND c.auto_renew AND c.renew_at <= now()`
	const activeSQL = `SELECT count(*) FROM proxy_domains WHERE ssl_status = 'active' AND ssl_provider = 'acme' AND verification_status = 'verified'`

	// The old worker's claims: those older than its 15 minutes go back, the others stay.
	stale := count(`SELECT count(*) FROM proxy_domains WHERE ssl_status = 'provisioning' AND ssl_last_attempt_at < now() - interval '15 minutes'`)
	require.Positive(t, stale)
	reclaimed, err := b.q.ReclaimAbandoned(ctx)
	require.NoError(t, err)
	require.Len(t, reclaimed, stale)
	require.Zero(t, count(`SELECT count(*) FROM proxy_domains WHERE ssl_status = 'provisioning' AND ssl_last_attempt_at < now() - interval '15 minutes'`))
	require.Positive(t, count(`SELECT count(*) FROM proxy_domains WHERE ssl_status = 'provisioning'`),
		"the old worker's live claims were taken")

	start := time.Now()
	dups, back, err := b.q.MarkCaseDuplicates(ctx)
	dupTime := time.Since(start)
	require.NoError(t, err)
	require.Len(t, dups, 1, "of two twins, one keeps the name")
	require.Subset(t, []string{legacydb.CaseDuplicate, legacydb.CaseDuplicateUpper}, domainsOf(dups))
	require.Empty(t, back)

	activeBefore := count(activeSQL)
	start = time.Now()
	pass, err := b.q.MarkRenewals(ctx)
	renewTime := time.Since(start)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{legacydb.Unparsable, legacydb.Misnamed}, domainsOf(pass.Bad))
	require.Zero(t, count(`SELECT count(*) FROM proxy_certificates WHERE auto_renew AND renew_at IS NULL`),
		"a certificate was left without a renewal time")
	require.Zero(t, count(dueSQL), "a certificate past its renewal time was not marked")
	require.EqualValues(t, activeBefore-count(activeSQL), pass.Marked)
	require.Positive(t, pass.Marked)

	pruned, err := b.q.Prune(ctx)
	require.NoError(t, err)
	require.EqualValues(t, legacydb.DeletedDomains, pruned.Certificates)
	t.Logf("on %d domains: MarkCaseDuplicates %s, first MarkRenewals %s (%d marked)", domains, dupTime, renewTime, pass.Marked)

	dups, back, err = b.q.MarkCaseDuplicates(ctx)
	require.NoError(t, err)
	require.Empty(t, dups)
	require.Empty(t, back)
	pass, err = b.q.MarkRenewals(ctx)
	require.NoError(t, err)
	require.Zero(t, pass.Marked)
	require.Empty(t, pass.Bad)
	pruned, err = b.q.Prune(ctx)
	require.NoError(t, err)
	require.Zero(t, pruned)
}

func domainsOf(rows []issuing.BadRow) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.Domain
	}
	return out
}
