package queue_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
)

func (b *bundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, sql, args...)
	require.NoError(t, err)
}

func (b *bundle) strings(t *testing.T, sql string, args ...any) []string {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, sql, args...)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// Nothing the worker keeps grows without bound: each kind of row is deleted once
// nothing will read it again, and only then.
func TestPrune_DeletesWhatNothingWillReadAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	_, kept := b.domain(t, tn, "active", 0, nil)

	// HTTP-01 tokens: an instance that died mid-order leaves its tokens behind.
	b.exec(t, `INSERT INTO certworker_http01_tokens (token, key_authorization, domain, expires_at) VALUES
    ('expired', 'k', 'a.example', now() - interval '1 minute'), ('live', 'k', 'b.example', now() + interval '5 minutes')`)
	// Pauses: kept for a day after they end.
	b.exec(t, `INSERT INTO certworker_pauses (scope, key, source, paused_until) VALUES
    ('ca', 'old', 'rate_limit', now() - interval '25 hours'),
    ('ca', 'recent', 'unreachable', now() - interval '1 hour'),
    ('domain', 'future.example', 'rate_limit', now() + interval '1 hour')`)
	// Ledger: no worker has recorded its limits, so the longest default window (168 h).
	b.exec(t, `INSERT INTO certworker_ledger (at, directory, name, registered_domain) VALUES
    (now() - interval '169 hours', 'd', 'old.example', 'old.example'),
    (now() - interval '167 hours', 'd', 'recent.example', 'recent.example')`)
	// Tenants' counters: one whose tenant has no domain left.
	gone := uuid.NewString()
	b.exec(t, `INSERT INTO certworker_tenants (tenant_id, vtime) VALUES ($1, 7), ($2, 3)
    ON CONFLICT (tenant_id) DO NOTHING`, gone, tn)
	// Certificates: of a deleted domain (and its key), of one deleted a minute ago (a
	// proxy may store the certificate before the domain), of a live domain, and of a
	// live domain stored under its name in another case.
	b.exec(t, `INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, updated_at) VALUES
    ('deleted.example', 'pem', 'key', now() - interval '2 hours'),
    ('just-written.example', 'pem', 'key', now() - interval '1 minute'),
    ($1, 'pem', 'key', now() - interval '2 hours'),
    (upper($1), 'pem', 'key', now() - interval '2 hours')`, kept)

	r, err := b.q.Prune(b.ctx)
	require.NoError(t, err)
	require.Equal(t, queue.PruneResult{Tokens: 1, Pauses: 1, Ledger: 1, Tenants: 1, Certificates: 1}, r)
	require.Equal(t, []string{"live"}, b.strings(t, `SELECT token FROM certworker_http01_tokens`))
	require.ElementsMatch(t, []string{"recent", "future.example"}, b.strings(t, `SELECT key FROM certworker_pauses`))
	require.Equal(t, []string{"recent.example"}, b.strings(t, `SELECT name FROM certworker_ledger`))
	require.Equal(t, []string{tn}, b.strings(t, `SELECT tenant_id::text FROM certworker_tenants`))
	require.ElementsMatch(t, []string{"just-written.example", kept, strings.ToUpper(kept)},
		b.strings(t, `SELECT domain FROM proxy_certificates`),
		"only the certificate of the domain deleted more than an hour ago goes")

	r, err = b.q.Prune(b.ctx)
	require.NoError(t, err)
	require.Zero(t, r, "a second prune found more to delete")
}

// The ledger is kept for the longest window among the limits the fleet runs with
// (certworker_settings.limits), so that no limit undercounts; an off limit is null.
func TestPrune_KeepsTheLedgerForTheLongestLimitWindow(t *testing.T) {
	// The failures in a row (a bucket of 1,152 days) are never read from rows, and
	// keep none.
	t.Parallel()
	b := setup(t)
	b.exec(t, `INSERT INTO certworker_settings (id, limits) VALUES (true,
    '{"orders_per_account": {"count": 300, "window_seconds": 10800}, "certs_per_registered_domain": null,
      "failed_authz_per_name": {"count": 5, "window_seconds": 3600},
      "consecutive_failures": {"count": 1152, "window_seconds": 99532800}}')
    ON CONFLICT (id) DO UPDATE SET limits = EXCLUDED.limits`)
	b.exec(t, `INSERT INTO certworker_ledger (at, directory, name, registered_domain) VALUES
    (now() - interval '4 hours', 'd', 'old.example', 'old.example'),
    (now() - interval '2 hours', 'd', 'recent.example', 'recent.example')`)
	r, err := b.q.Prune(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, r.Ledger)
	require.Equal(t, []string{"recent.example"}, b.strings(t, `SELECT name FROM certworker_ledger`))
}

// Each CA's ledger rows are kept for its own longest window: a second CA whose
// --acme-fallback-limit-* window (a week here) is longer than the first's (3 hours,
// which certworker_settings records) keeps its rows of 4 hours ago, and the first's
// go. Only the first CA's windows were read, so the second's longer window
// undercounted.
func TestPrune_KeepsEachCAsLedgerForItsOwnLongestWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `INSERT INTO certworker_settings (id, limits) VALUES (true,
    '{"orders_per_account": {"count": 300, "window_seconds": 10800}}')
    ON CONFLICT (id) DO UPDATE SET limits = EXCLUDED.limits`)
	b.exec(t, `INSERT INTO certworker_ledger (at, directory, name, registered_domain) VALUES
    (now() - interval '4 hours', 'first', 'first-old.example', 'first-old.example'),
    (now() - interval '4 hours', 'second', 'second-old.example', 'second-old.example'),
    (now() - interval '200 hours', 'second', 'second-older.example', 'second-older.example')`)
	r, err := b.q.Prune(b.ctx,
		queue.LedgerWindow{Directory: "first", Window: 3 * time.Hour},
		queue.LedgerWindow{Directory: "second", Window: 168 * time.Hour})
	require.NoError(t, err)
	require.EqualValues(t, 2, r.Ledger)
	require.Equal(t, []string{"second-old.example"}, b.strings(t, `SELECT name FROM certworker_ledger`))
}

// Years without pruning leave far more than one batch: one call deletes it all, in
// batches (short transactions on the proxy's database).
func TestPrune_DeletesMoreThanOneBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `INSERT INTO certworker_http01_tokens (token, key_authorization, domain, expires_at)
    SELECT 't' || g, 'k', 'a.example', now() - interval '1 day' FROM generate_series(1, 2500) g`)
	r, err := b.q.Prune(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2500, r.Tokens)
}

// A bucket whose tat is past is full, as no row says: it is pruned, and one still
// refilling is kept.
func TestPrune_DeletesFullBucketsOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `INSERT INTO certworker_buckets (directory, kind, key, tat) VALUES
    ('d', 'account', 'd', now() - interval '1 second'),
    ('d', 'exact_set', 'refilling.example', now() + interval '1 hour')`)
	r, err := b.q.Prune(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, r.Buckets)
	require.Equal(t, []string{"refilling.example"}, b.strings(t, `SELECT key FROM certworker_buckets`))
}
