package queue_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// Guards against the proxy paying for a mode it does not use: in logical mode the
// wake trigger must not call pg_notify (whose commit lock is the cost), and in notify
// mode, the default with no setting recorded, it must. In both it stamps
// ssl_queued_at. And SetMode reports what it replaced, so that `run` can warn when it
// switches a fleet's mode.
func TestSetWakeMode_TriggerNotifiesOnlyInNotifyMode(t *testing.T) {
	t.Parallel()
	pool, dsn := pgtest.NewPool(t)
	q := queue.New(pool, issuing.DefaultConfig())
	ctx := context.Background()
	var tenant string
	require.NoError(t, pool.QueryRow(ctx,
		"INSERT INTO proxy_tenants (name, slug, email) VALUES ('t', 't', 't@example.com') RETURNING id").Scan(&tenant))

	// notified runs a claimable insert and counts the notifications a listening
	// session receives, and checks ssl_queued_at.
	notified := func(t *testing.T) int {
		t.Helper()
		conn, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "LISTEN certworker_wake")
		require.NoError(t, err)
		var queued *time.Time
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO proxy_domains
			(tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
			VALUES ($1, $2, 'verified', 'tok', 'pending', 'acme') RETURNING ssl_queued_at`,
			tenant, "m-"+uuid.NewString()+".example").Scan(&queued))
		require.NotNil(t, queued, "the trigger must stamp ssl_queued_at in every mode")
		return wakesBeforeMarker(t, ctx, conn, pool)
	}

	require.Equal(t, 1, notified(t), "no setting recorded: notify, as before migration 00004")

	prev, err := q.SetWakeMode(ctx, issuing.WakeLogical)
	require.NoError(t, err)
	require.Equal(t, issuing.WakeNotify, prev, "no setting recorded counts as notify")
	require.Zero(t, notified(t), "logical mode: the trigger must not notify")

	prev, err = q.SetWakeMode(ctx, issuing.WakeLogical)
	require.NoError(t, err)
	require.Equal(t, issuing.WakeLogical, prev)

	prev, err = q.SetWakeMode(ctx, issuing.WakeNotify)
	require.NoError(t, err)
	require.Equal(t, issuing.WakeLogical, prev)
	require.Equal(t, 1, notified(t))

	_, err = q.SetWakeMode(ctx, "carrier-pigeon")
	require.Error(t, err)
	var rows int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM certworker_settings").Scan(&rows))
	require.Equal(t, 1, rows, "one row at most")
}

// Guards against the new setting breaking the proxy's writes: the trigger runs with
// the privileges of whoever writes proxy_domains, and the proxy's role was granted
// what it needs on the proxy's tables, not on certworker_settings, which did not
// exist then. Its "verify" must still work, in both modes.
func TestSetWakeMode_TriggerWorksForARoleWithoutGrantsOnSettings(t *testing.T) {
	t.Parallel()
	pool, dsn := pgtest.NewPool(t)
	q := queue.New(pool, issuing.DefaultConfig())
	ctx := context.Background()
	role := "proxy_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	for _, sql := range []string{
		fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD 'proxy-pw'", role),
		fmt.Sprintf("GRANT SELECT, INSERT, UPDATE ON proxy_tenants, proxy_domains TO %s", role),
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = pool.Exec(context.Background(), "DROP ROLE "+role)
	})
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.User = url.UserPassword(role, "proxy-pw")
	proxy, err := pgx.Connect(ctx, u.String())
	require.NoError(t, err)
	defer proxy.Close(ctx)

	var tenant string
	require.NoError(t, proxy.QueryRow(ctx,
		"INSERT INTO proxy_tenants (name, slug, email) VALUES ('t', 't', 't@example.com') RETURNING id").Scan(&tenant))
	for _, mode := range []string{issuing.WakeNotify, issuing.WakeLogical} {
		_, err := q.SetWakeMode(ctx, mode)
		require.NoError(t, err)
		_, err = proxy.Exec(ctx, `INSERT INTO proxy_domains
			(tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
			VALUES ($1, $2, 'verified', 'tok', 'pending', 'acme')`, tenant, mode+".example")
		require.NoError(t, err, "mode %s", mode)
	}

	// A worker whose role was not granted anything on the new table (an upgrade
	// where a separate role migrates) still starts in the mode already in force,
	// and is told what it lacks to switch.
	limited, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	defer limited.Close()
	ql := queue.New(limited, issuing.DefaultConfig())
	prev, err := ql.SetWakeMode(ctx, issuing.WakeLogical)
	require.NoError(t, err, "no change, no write")
	require.Equal(t, issuing.WakeLogical, prev)
	_, err = ql.SetWakeMode(ctx, issuing.WakeNotify)
	require.ErrorContains(t, err, "needs INSERT and UPDATE")
}
