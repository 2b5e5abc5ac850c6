package migrations_test

import (
	"context"
	"fmt"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/migrations"
)

// lockWaitSlack is how much longer than its lock timeout a statement of migrate's may
// be seen waiting for a lock before the watch calls it a wait without a timeout: the
// sampling's own delay and a loaded machine's, far below any test's patience.
const lockWaitSlack = 5 * time.Second

// upWatched is migrations.Up on url, watched: a statement of migrate's that waits for
// a lock (a table's, or the old snapshots a concurrent index build waits for) longer
// than opts' lock timeout means migrate's sessions have no lock_timeout, and the test
// then fails within seconds, saying so, instead of hanging until the test binary's
// timeout (the tests below hold a snapshot open that only a migration giving up lets
// go of).
func upWatched(t *testing.T, dbURL string, opts migrations.Options) ([]migrations.Result, error) {
	t.Helper()
	app := fmt.Sprintf("migrate-watched-%d", time.Now().UnixNano())
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	limit := opts.LockTimeout
	if limit <= 0 {
		limit = migrations.DefaultLockTimeout
	}
	limit += lockWaitSlack

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stuck atomic.Pointer[string]
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		watch(ctx, dbURL, app, limit, func(msg string) {
			stuck.Store(&msg)
			cancel()
		})
	}()
	results, err := migrations.Up(ctx, openDB(t, u.String()), opts)
	cancel()
	<-watched
	if msg := stuck.Load(); msg != nil {
		t.Fatalf("%s: migrate's statements wait on locks without giving up; is lock_timeout set on its sessions? (Up: %v)", *msg, err)
	}
	return results, err
}

// watch samples, until ctx ends, the sessions named app that wait for a lock, and
// calls stuck once one wait has lasted longer than limit.
func watch(ctx context.Context, dbURL, app string, limit time.Duration, stuck func(string)) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return
	}
	defer conn.Close(context.Background())
	type wait struct {
		pid   int
		start time.Time
	}
	seen := map[wait]time.Time{}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rows, err := conn.Query(ctx, `
SELECT pid, query_start, wait_event, left(query, 80) FROM pg_stat_activity
WHERE application_name = $1 AND state = 'active' AND wait_event_type = 'Lock'`, app)
		if err != nil {
			return
		}
		for rows.Next() {
			var w wait
			var event, query string
			if rows.Scan(&w.pid, &w.start, &event, &query) != nil {
				break
			}
			first, ok := seen[w]
			if !ok {
				seen[w] = time.Now()
				continue
			}
			if waited := time.Since(first); waited > limit {
				rows.Close()
				stuck(fmt.Sprintf("a statement of migrate's waited %s for a lock (%s), past its lock timeout: %q",
					waited.Round(time.Second), event, query))
				return
			}
		}
		rows.Close()
	}
}
