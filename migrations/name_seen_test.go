package migrations_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
)

// nameSeenFixture: tenant a's domains, each named for what it is. Only waiting.example
// waits for its DNS (verified, acme, pending, held 'dns', a check scheduled an hour
// ahead); running.example waits too, with its check running on some instance.
const nameSeenFixture = `
INSERT INTO proxy_tenants (id, name, slug, email) VALUES ('00000000-0000-0000-0000-00000000000a', 'a', 'a', 'a@example.com');
CREATE FUNCTION pg_temp.add(name text, verification text, status text, held text, checked boolean) RETURNS void
LANGUAGE sql AS $$
    WITH d AS (
        INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_provider, ssl_status)
        VALUES ('00000000-0000-0000-0000-00000000000a', name, verification, 'tok', 'acme', status)
        RETURNING id
    )
    INSERT INTO certworker_dns_state (domain_id, waiting_since, next_check_at)
    SELECT id, now() - interval '2 days', CASE WHEN checked THEN now() + interval '1 hour' END FROM d;
    -- The wake trigger clears a hold the insert sets; the waiter's hand-back sets it.
    UPDATE proxy_domains SET ssl_held = held WHERE domain = name AND held IS NOT NULL;
$$;
SELECT pg_temp.add('waiting.example', 'verified', 'pending', 'dns', true);
SELECT pg_temp.add('running.example', 'verified', 'pending', 'dns', true);
UPDATE certworker_dns_state SET taken_until = now() + interval '1 minute'
WHERE domain_id = (SELECT id FROM proxy_domains WHERE domain = 'running.example');
SELECT pg_temp.add('unverified.example', 'pending', 'pending', 'dns', true);
SELECT pg_temp.add('active.example', 'verified', 'active', NULL, false);
SELECT pg_temp.add('inline.example', 'verified', 'pending', NULL, false);
SELECT pg_temp.add('ended.example', 'verified', 'pending', 'dns', false);
SELECT pg_temp.add('failed.example', 'verified', 'failed', NULL, true);`

func nameSeenDB(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	url := pgtest.NewDB(t)
	_, err := connect(t, url).Exec(context.Background(), nameSeenFixture)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, url
}

// seen calls certworker_name_seen(name) in a transaction of its own, and returns its
// answer and whether the transaction was given an id (it wrote something).
func seen(t testing.TB, ctx context.Context, db beginner, name string) (bool, bool) {
	t.Helper()
	got, wrote, err := trySeen(ctx, db, name)
	require.NoError(t, err)
	return got, wrote
}

type beginner interface {
	Begin(context.Context) (pgx.Tx, error)
}

// trySeen is seen, returning the error.
func trySeen(ctx context.Context, db beginner, name string) (got, wrote bool, err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, false, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	var txid *int64
	if err := tx.QueryRow(ctx, `SELECT certworker_name_seen($1)`, name).Scan(&got); err != nil {
		return false, false, err
	}
	if err := tx.QueryRow(ctx, `SELECT txid_current_if_assigned()`).Scan(&txid); err != nil {
		return false, false, err
	}
	return got, txid != nil, tx.Commit(ctx)
}

type seenState struct {
	Due    bool // next_check_at <= now()
	SeenAt *time.Time
}

func seenStateOf(t *testing.T, db *pgxpool.Pool, name string) seenState {
	t.Helper()
	var s seenState
	require.NoError(t, db.QueryRow(context.Background(), `
SELECT COALESCE(s.next_check_at <= now(), false), s.seen_at
FROM certworker_dns_state s JOIN proxy_domains d ON d.id = s.domain_id WHERE d.domain = $1`, name).Scan(&s.Due, &s.SeenAt))
	return s
}

// A handshake for a verified domain waiting for its DNS brings its check forward to
// now and records the handshake (true), whatever the case and a trailing dot of the
// name asked; for any other name (not waiting, not verified, issued, in line, failed,
// a wait already ended, nobody's) it returns false with no transaction id, nothing
// written; a running check is left to finish (its next check follows the handshake
// rule). Guards against a handshake that never reaches the waiter, and against one
// that writes, or brings forward, what is not waiting.
func TestNameSeen_BringsOnlyAWaitingDomainsCheckForward(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := nameSeenDB(t)

	for _, name := range []string{"unverified.example", "active.example", "inline.example", "ended.example",
		"failed.example", "nobody.example", "", ".", "waiting.example.x", "*.waiting.example"} {
		got, wrote := seen(t, ctx, db, name)
		require.False(t, got, name)
		require.False(t, wrote, "%q: a transaction id was assigned", name)
	}
	var touched int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM certworker_dns_state WHERE seen_at IS NOT NULL OR next_check_at <= now()`).Scan(&touched))
	require.Zero(t, touched, "a name not waiting was written")

	got, wrote := seen(t, ctx, db, "WAITING.Example.")
	require.True(t, got)
	require.True(t, wrote)
	s := seenStateOf(t, db, "waiting.example")
	require.True(t, s.Due, "the check was not brought forward")
	require.NotNil(t, s.SeenAt)

	got, _ = seen(t, ctx, db, "running.example")
	require.True(t, got)
	s = seenStateOf(t, db, "running.example")
	require.False(t, s.Due, "a running check was brought forward, for a second instance to run it again")
	require.NotNil(t, s.SeenAt)
}

// 1,000 calls for one waiting name within 10 s, 20 at a time from 20 sessions: one
// true and one transaction id among them; the others read and write nothing. Then,
// once 10 s have passed, a call writes again. Guards against a handshake storm (every
// client of a popular name, the moment its DNS moves) turning into a write per
// handshake on the proxy's database, and against calls queueing on the one row.
func TestNameSeen_AThousandCallsWriteOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := nameSeenDB(t)
	start := time.Now()
	var mu sync.Mutex
	trues, writes := 0, 0
	var wg sync.WaitGroup
	for w := range 20 {
		wg.Go(func() {
			for i := range 50 {
				name := "waiting.example"
				if (w+i)%2 == 1 {
					name = "Waiting.Example."
				}
				got, wrote := seen(t, ctx, db, name)
				mu.Lock()
				if got {
					trues++
				}
				if wrote {
					writes++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Less(t, time.Since(start), 10*time.Second, "the calls took too long for the test to mean anything")
	require.Equal(t, 1, trues, "true answers")
	require.Equal(t, 1, writes, "transactions given an id")

	// 10 s after the handshake recorded, the next one is recorded again.
	_, err := db.Exec(ctx, `UPDATE certworker_dns_state SET seen_at = seen_at - interval '10 seconds', next_check_at = now() + interval '1 hour'
WHERE seen_at IS NOT NULL`)
	require.NoError(t, err)
	got, wrote := seen(t, ctx, db, "waiting.example")
	require.True(t, got)
	require.True(t, wrote)
	require.True(t, seenStateOf(t, db, "waiting.example").Due)
}

// No call waits on a row another session holds: with the waiting domain's state row
// locked (a waiter taking or rescheduling its check) and its proxy_domains row locked
// (the proxy's own write), a call returns at once, false and without a write, and the
// next call once the lock is gone returns true. Guards against an UPDATE that queues
// behind the lock and holds a handshake for as long as the other transaction lasts.
func TestNameSeen_NeverWaitsOnALockedRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, url := nameSeenDB(t)
	holder := connect(t, url)
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM certworker_dns_state s JOIN proxy_domains d ON d.id = s.domain_id
WHERE d.domain = 'waiting.example' FOR UPDATE`)
	require.NoError(t, err)

	// A call that queued behind the lock would fail here with lock_not_available
	// (55P03) after 10 ms, however busy the machine: nothing else holds a lock it
	// could wait for.
	caller := connect(t, url)
	_, err = caller.Exec(ctx, `SET lock_timeout = '10ms'`)
	require.NoError(t, err)
	got, wrote, err := trySeen(ctx, caller, "waiting.example")
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		require.NotEqual(t, "55P03", pgErr.Code, "the call waited for the lock: %v", err)
	}
	require.NoError(t, err)
	require.False(t, got)
	require.False(t, wrote)

	require.NoError(t, tx.Rollback(ctx))
	got, _ = seen(t, ctx, db, "waiting.example")
	require.True(t, got, "a call after the lock was released")
}

// The look-up reads proxy_domains through the index on the lowered name and the state
// by its key, never a sequential scan: at a million domains a scan per handshake
// would take the proxy's database down. Each name is asked on a session of its own:
// pg_stat_xact_user_tables reads the session's counts not yet sent to the statistics
// (sent at most once a second), so a session that ran the bulk INSERT below could
// still show its scan.
func TestNameSeen_ReadsThroughTheIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, url := nameSeenDB(t)
	_, err := db.Exec(ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_provider, ssl_status)
SELECT '00000000-0000-0000-0000-00000000000a', 'n' || i || '.bulk.example', 'verified', 'tok', 'acme', 'active'
FROM generate_series(1, 20000) i;
INSERT INTO certworker_dns_state (domain_id, challenge) SELECT id, 'http-01' FROM proxy_domains ON CONFLICT DO NOTHING;
ANALYZE proxy_domains; ANALYZE certworker_dns_state`)
	require.NoError(t, err)
	for _, name := range []string{"waiting.example", "n17.bulk.example", "nobody.example"} {
		tx, err := connect(t, url).Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT certworker_name_seen($1)`, name)
		require.NoError(t, err)
		var seq, idx int64
		require.NoError(t, tx.QueryRow(ctx, `SELECT COALESCE(sum(seq_scan), 0), COALESCE(sum(idx_scan), 0) FROM pg_stat_xact_user_tables
WHERE relname IN ('proxy_domains', 'certworker_dns_state')`).Scan(&seq, &idx))
		require.NoError(t, tx.Rollback(ctx))
		require.Zero(t, seq, "%s: a sequential scan", name)
		require.Positive(t, idx, name)
	}
}
