package main_test

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/releasetest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/migrations"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// proxyWriter is the proxy's writes while a phase of the upgrade runs: a tenant and a
// verified ACME domain inserted every 20 ms, as a tenant's "add domain" does, and
// every other time an update of a domain inserted before (its verification token,
// a column of the proxy's), which fires the triggers on rows the workers may hold.
type proxyWriter struct {
	b      *bed
	mu     sync.Mutex
	ids    []string
	err    error
	cancel context.CancelFunc
	done   chan struct{}
}

func (w *proxyWriter) start() {
	ctx, cancel := context.WithCancel(w.b.ctx)
	w.cancel, w.done = cancel, make(chan struct{})
	go func() {
		defer close(w.done)
		for i := 0; ctx.Err() == nil; i++ {
			if err := w.write(ctx, i); err != nil && ctx.Err() == nil {
				w.mu.Lock()
				w.err = err
				w.mu.Unlock()
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
}

func (w *proxyWriter) write(ctx context.Context, i int) error {
	var id string
	err := w.b.pool.QueryRow(ctx, `
WITH t AS (INSERT INTO proxy_tenants (name, slug, email) VALUES ('upgrade test', $1, 'u@certworker.invalid') RETURNING id)
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
SELECT id, $2, 'verified', 'tok', 'pending', 'acme' FROM t RETURNING id::text`,
		"t-"+uuid.NewString(), fmt.Sprintf("u-%s.example", uuid.NewString())).Scan(&id)
	if err != nil {
		return fmt.Errorf("insert: %w", err)
	}
	w.mu.Lock()
	w.ids = append(w.ids, id)
	earlier := w.ids[len(w.ids)/2]
	w.mu.Unlock()
	if i%2 == 1 {
		if _, err := w.b.pool.Exec(ctx, `UPDATE proxy_domains SET verification_token = $2 WHERE id = $1`, earlier, fmt.Sprint("tok-", i)); err != nil {
			return fmt.Errorf("update: %w", err)
		}
	}
	return nil
}

// stop ends the writes and waits until every domain written is issued.
func (w *proxyWriter) stop(t *testing.T) {
	t.Helper()
	w.cancel()
	<-w.done
	w.mu.Lock()
	require.NoError(t, w.err, "a write of the proxy's failed")
	w.mu.Unlock()
	w.waitIssued(t, len(w.written()))
}

// written is every domain written so far.
func (w *proxyWriter) written() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.ids...)
}

// waitIssued waits until the first n domains written are active. It fails when no
// domain written, of those n or any written since, is issued for stallAfter: what
// the test holds is that every domain is issued, and a backlog the workers drain
// more slowly on a busy host is not a failure, while one they stop draining is. The
// writes may go on meanwhile, faster than a loaded host issues (a domain every
// 20 ms or so), so the domains still to issue can grow while the workers issue: the
// workers' progress is the count issued, not the count left.
func (w *proxyWriter) waitIssued(t *testing.T, n int) {
	t.Helper()
	const stallAfter, waitAtMost = 15 * time.Second, 3 * time.Minute
	most, since, deadline := -1, time.Now(), time.Now().Add(waitAtMost)
	for {
		ids := w.written()
		var pending, issued int
		require.NoError(t, w.b.pool.QueryRow(w.b.ctx, `
SELECT count(*) FILTER (WHERE ssl_status <> 'active' AND id = ANY ($2::uuid[])), count(*) FILTER (WHERE ssl_status = 'active')
FROM proxy_domains WHERE id = ANY ($1::uuid[])`, ids, ids[:n]).Scan(&pending, &issued))
		if pending == 0 {
			return
		}
		if issued > most {
			most, since = issued, time.Now()
		}
		if time.Since(since) > stallAfter {
			t.Fatalf("%d of the first %d domains written are not issued, and none of the %d written was for %s", pending, n, len(ids), stallAfter)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the first %d domains written are not issued after %s, while %d of the %d written were: the oldest are passed over",
				pending, n, waitAtMost, issued, len(ids))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitMore waits until n more domains than written now are written, and issued.
func (w *proxyWriter) waitMore(t *testing.T, n int) {
	t.Helper()
	target := len(w.written()) + n
	for deadline := time.Now().Add(15 * time.Second); len(w.written()) < target; time.Sleep(20 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "the proxy's writes stalled")
	}
	w.waitIssued(t, target)
}

// ordersStarted counts the orders each instance logged, by domain.
func ordersStarted(counts map[string]int, p *proc) {
	for _, e := range entries(p.logs) {
		if e.msg() == "order started" {
			counts[fmt.Sprint(e["domain"])]++
		}
	}
}

// The upgrade to the next release and the rollback from it, with no step of the
// operator's but migrate, while the proxy writes throughout (docs/upgrading.md). The
// next release is synthetic (internal/releasetest): a column on proxy_domains, a
// trigger filling it on every status written, and a new body of
// certworker_queue_place, which this release's claim and wake trigger call.
//
//   - The next release's migrate runs while this release's instance claims and issues;
//     it keeps issuing, and its writes go through the new trigger.
//   - This release's instance, SIGKILLed after it, starts again on the next release's
//     schema (the same check as `run`'s) and keeps issuing.
//   - The next release's instance takes over.
//   - This release's instance starts again after it (the rollback) and issues.
//
// Every domain the proxy wrote is issued, and ordered once. Guards against a schema
// check that refuses the next release's schema (the old binary could then never
// restart during a rolling deploy), and against a next release whose additions break
// this release's claim, issue or the proxy's writes.
func TestUpgrade_NextReleaseMigratesUnderTheOldOneWhichRestartsAndIsRolledBackTo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	next := releasetest.Next(t)
	args := []string{"--delay", "20ms", "--concurrency", "2", "--lease", "3s", "--poll-interval", "1s"}
	counts := map[string]int{}
	w := &proxyWriter{b: b}

	n1 := startProc(t, b.dsn, "N1-"+uuid.NewString()[:8], args...)
	w.start()
	w.waitMore(t, 10)

	db := stdlib.OpenDBFromPool(b.pool)
	defer db.Close()
	results, err := migrations.Up(b.ctx, db, migrations.Options{Release: &next, LockTimeout: 500 * time.Millisecond})
	require.NoError(t, err)
	require.NotEmpty(t, results)
	// The proxy's writes are one at a time, so one may have been in flight as migrate
	// returned: it may have committed, and been claimed, before the new trigger was
	// in place. Each write recorded after that one began after migrate had returned.
	inFlight := len(w.written())
	w.waitMore(t, 10)
	w.stop(t)
	require.True(t, n1.running())
	after := w.written()[inFlight+1:]
	var throughTrigger int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM proxy_domains WHERE id = ANY ($1::uuid[]) AND `+releasetest.Column+` LIKE '%provisioning%active'`, after).Scan(&throughTrigger))
	require.Equal(t, len(after), throughTrigger, "this release's claims and issues after the next release's migrate did not go through its trigger")

	n1.signal(t, syscall.SIGKILL, 10*time.Second)
	ordersStarted(counts, n1)
	w.start()
	n2 := startProc(t, b.dsn, "N2-"+uuid.NewString()[:8], args...)
	w.waitMore(t, 10)
	w.stop(t)
	n2.signal(t, syscall.SIGTERM, 10*time.Second)
	ordersStarted(counts, n2)

	require.NoError(t, migrations.CheckRelease(b.ctx, db, next))
	fake := fakeissuer.New(0)
	fake.Delay = 20 * time.Millisecond
	nextInstance := workertest.Start(t, b.dsn, "next", worker.Config{
		Issuer: fake, Concurrency: 2, PollInterval: time.Second, Queue: issuing.Config{Lease: 3 * time.Second},
	})
	w.start()
	w.waitMore(t, 10)
	w.stop(t)
	require.NoError(t, nextInstance.Stop(t, 10*time.Second))
	for d, n := range fake.Counts() {
		counts[d] += n
	}

	n3 := startProc(t, b.dsn, "N3-"+uuid.NewString()[:8], args...)
	w.start()
	w.waitMore(t, 10)
	w.stop(t)
	n3.signal(t, syscall.SIGTERM, 10*time.Second)
	ordersStarted(counts, n3)

	names := map[string]string{}
	rows, err := b.pool.Query(b.ctx, `SELECT id::text, domain FROM proxy_domains WHERE id = ANY ($1::uuid[])`, w.written())
	require.NoError(t, err)
	for rows.Next() {
		var id, name string
		require.NoError(t, rows.Scan(&id, &name))
		names[id] = name
	}
	require.NoError(t, rows.Err())
	var twice []string
	for _, id := range w.written() {
		if counts[names[id]] != 1 {
			twice = append(twice, fmt.Sprintf("%s ordered %d times", names[id], counts[names[id]]))
		}
	}
	require.Empty(t, twice, "of %d domains", len(w.written()))
	t.Logf("%d domains issued across the upgrade and the rollback", len(w.written()))
}
