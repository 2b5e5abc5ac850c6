package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// notifications listens on certworker_wake on a connection of its own, runs change
// (committed: a rolled-back transaction delivers nothing), and counts what arrives.
func (b *bundle) notifications(t *testing.T, change func()) int {
	t.Helper()
	conn, err := pgx.Connect(b.ctx, b.dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(b.ctx, "LISTEN certworker_wake")
	require.NoError(t, err)
	change()
	return wakesBeforeMarker(t, b.ctx, conn, b.pool)
}

// wakesBeforeMarker counts the notifications on certworker_wake that conn, listening,
// receives before a marker sent through pool once the changes are committed. The
// server delivers notifications in commit order, so when the marker comes every one
// committed before it has come, however late a busy server sends them (a 300 ms wait
// for stragglers would take a late one for none).
func wakesBeforeMarker(t *testing.T, ctx context.Context, conn *pgx.Conn, pool *pgxpool.Pool) int {
	t.Helper()
	marker := "test-marker-" + uuid.NewString()
	_, err := pool.Exec(ctx, `SELECT pg_notify('certworker_wake', $1)`, marker)
	require.NoError(t, err)
	n := 0
	for {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		got, err := conn.WaitForNotification(wctx)
		cancel()
		require.NoError(t, err, "waiting for the marker")
		if got.Channel == "certworker_wake" && got.Payload == marker {
			return n
		}
		n++
	}
}

// The wake trigger fires exactly when a row enters the claimable set (verified, acme,
// pending) from outside it. Each case says why it matters.
func TestTrigger_NotifiesExactlyOnEnteringTheClaimableSet(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		setup func(b *bundle, t *testing.T, tn string) string // returns a domain id, or ""
		act   string                                          // SQL with $1 = the id
		fires bool
		// quiet runs act in a transaction marked as the worker's own failure write.
		quiet bool
	}{
		{"insert verified acme pending", nil,
			`INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
			 VALUES ($1, 'new.example', 'verified', 'tok', 'pending', 'acme')`, true, false},
		{"insert unverified", nil,
			`INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
			 VALUES ($1, 'new.example', 'pending', 'tok', 'pending', 'acme')`, false, false},
		// The tenant's "verify" click: the reason this project exists.
		{"pending domain verified", func(b *bundle, t *testing.T, tn string) string { return b.insert(t, tn, "pending", "pending", "acme") },
			`UPDATE proxy_domains SET verification_status = 'verified' WHERE id = $1`, true, false},
		{"failed retried", func(b *bundle, t *testing.T, tn string) string {
			id, _ := b.domain(t, tn, "failed", 10, ago(60))
			return id
		},
			`UPDATE proxy_domains SET ssl_status = 'pending', ssl_attempts = 0 WHERE id = $1`, true, false},
		{"active due for renewal", func(b *bundle, t *testing.T, tn string) string { id, _ := b.domain(t, tn, "active", 0, nil); return id },
			`UPDATE proxy_domains SET ssl_status = 'pending' WHERE id = $1`, true, false},
		{"manual to acme while verified and pending", func(b *bundle, t *testing.T, tn string) string {
			return b.insert(t, tn, "verified", "pending", "manual")
		},
			`UPDATE proxy_domains SET ssl_provider = 'acme' WHERE id = $1`, true, false},
		// Stays inside the set: the worker's own bookkeeping must not wake everyone.
		{"pending back to pending with one more attempt", func(b *bundle, t *testing.T, tn string) string {
			id, _ := b.domain(t, tn, "pending", 1, ago(5))
			return id
		},
			`UPDATE proxy_domains SET ssl_attempts = ssl_attempts + 1, ssl_error = 'x' WHERE id = $1`, false, false},
		// A failure recorded by the worker: it sets its own timer for the backoff.
		{"provisioning back to pending by the worker's failure write", func(b *bundle, t *testing.T, tn string) string {
			id, _ := b.domain(t, tn, "provisioning", 1, ago(5))
			return id
		},
			`UPDATE proxy_domains SET ssl_status = 'pending', ssl_attempts = 2 WHERE id = $1`, false, true},
		// Anyone else moving a row out of provisioning (an operator's edit, the proxy,
		// the Rust worker during a cutover) wakes the workers.
		{"provisioning back to pending by an operator", func(b *bundle, t *testing.T, tn string) string {
			id, _ := b.domain(t, tn, "provisioning", 1, ago(5))
			return id
		},
			`UPDATE proxy_domains SET ssl_status = 'pending' WHERE id = $1`, true, false},
		{"provisioning to active", func(b *bundle, t *testing.T, tn string) string {
			id, _ := b.domain(t, tn, "provisioning", 0, ago(5))
			return id
		},
			`UPDATE proxy_domains SET ssl_status = 'active' WHERE id = $1`, false, false},
		{"unrelated update of a claimable row", func(b *bundle, t *testing.T, tn string) string {
			id, _ := b.domain(t, tn, "pending", 0, nil)
			return id
		},
			`UPDATE proxy_domains SET verification_method = 'http' WHERE id = $1`, false, false},
		{"pending domain verified while manual", func(b *bundle, t *testing.T, tn string) string {
			return b.insert(t, tn, "pending", "pending", "manual")
		},
			`UPDATE proxy_domains SET verification_status = 'verified' WHERE id = $1`, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			tn := b.tenant(t)
			arg := tn
			if tc.setup != nil {
				arg = tc.setup(b, t, tn)
			}
			n := b.notifications(t, func() {
				err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
					if tc.quiet {
						if _, err := tx.Exec(b.ctx, `SET LOCAL certworker.quiet = on`); err != nil {
							return err
						}
					}
					_, err := tx.Exec(b.ctx, tc.act, arg)
					return err
				})
				require.NoError(t, err)
			})
			if tc.fires {
				require.Equal(t, 1, n, "expected one wake-up")
			} else {
				require.Zero(t, n, "expected no wake-up")
			}
		})
	}
}

// A statement that verifies 1,000 domains wakes each listener once, not 1,000 times:
// a thousand passes for one batch would be a storm of empty claims.
func TestTrigger_ABulkUpdateSendsOneNotification(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
SELECT $1, 'bulk' || g || '.example', 'pending', 'tok', 'pending', 'acme' FROM generate_series(1, 1000) g`, tn)
	require.NoError(t, err)
	n := b.notifications(t, func() {
		tag, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET verification_status = 'verified'`)
		require.NoError(t, err)
		require.EqualValues(t, 1000, tag.RowsAffected())
	})
	require.GreaterOrEqual(t, n, 1, "a bulk verify sent nothing")
	require.LessOrEqual(t, n, 3, "a bulk verify sent %d notifications", n)
}

// Bad values are refused by the database itself, not only by the proxy's code: each
// with the SQLSTATE of the constraint that refuses it (23514 check_violation, 23503
// foreign_key_violation), so that a statement failing for another reason (a typo, a
// parameter count) cannot pass for a refusal.
func TestSchema_RefusesBadValues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	for _, tc := range []struct {
		stmt  string
		args  []any
		state string
	}{
		{`INSERT INTO proxy_domains (tenant_id, domain, verification_token, ssl_status) VALUES ($1, 'a.example', 't', 'bogus')`, []any{tn}, "23514"},
		{`INSERT INTO proxy_domains (tenant_id, domain, verification_token, ssl_provider) VALUES ($1, 'a.example', 't', 'bogus')`, []any{tn}, "23514"},
		{`INSERT INTO proxy_domains (tenant_id, domain, verification_token, verification_status) VALUES ($1, 'a.example', 't', 'bogus')`, []any{tn}, "23514"},
		{`INSERT INTO proxy_domains (tenant_id, domain, verification_token, verification_method) VALUES ($1, 'a.example', 't', 'bogus')`, []any{tn}, "23514"},
		{`INSERT INTO proxy_domains (tenant_id, domain, verification_token) VALUES (gen_random_uuid(), 'a.example', 't')`, nil, "23503"},
	} {
		_, err := b.pool.Exec(b.ctx, tc.stmt, tc.args...)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, tc.stmt)
		require.Equal(t, tc.state, pgErr.Code, "%s: %s", tc.stmt, pgErr.Message)
	}
}
