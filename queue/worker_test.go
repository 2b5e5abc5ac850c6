package queue_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/queue"
)

// instance is one in-process worker: its own pool, listener and logs.
type instance struct {
	logs *observer.ObservedLogs
	stop context.CancelFunc
	// done is closed when Run has returned, with its error in err.
	done chan struct{}
	err  error
}

// wait waits for Run to return and gives its error.
func (in *instance) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case <-in.done:
		return in.err
	case <-time.After(timeout):
		t.Fatal("the worker did not stop")
		return nil
	}
}

func startWorker(t *testing.T, dsn string, issuer queue.Issuer, qcfg queue.Config, wcfg queue.WorkerConfig) *instance {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	ctx, cancel := context.WithCancel(context.Background())
	lst := listener.New(pool, log, listener.Options{BackoffMin: 50 * time.Millisecond, BackoffMax: time.Second})
	require.NoError(t, lst.Start(ctx))
	if wcfg.Owner == "" {
		wcfg.Owner = "test"
	}
	if wcfg.Directory == "" {
		wcfg.Directory = "https://ca.invalid/directory"
	}
	w := queue.NewWorker(queue.New(pool, qcfg), issuer, lst.Wakes(), log, wcfg, nil)
	in := &instance{logs: logs, stop: cancel, done: make(chan struct{})}
	go func() { in.err = w.Run(ctx); close(in.done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-in.done:
		case <-time.After(time.Minute):
			t.Error("worker did not stop")
		}
		lst.Stop()
		pool.Close()
	})
	return in
}

// waitFor polls cond (a database read) every 20ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (in *instance) startedWith(domain string) []string {
	var sources []string
	for _, e := range in.logs.FilterMessage("order started").All() {
		if e.ContextMap()["domain"] == domain {
			sources = append(sources, fmt.Sprint(e.ContextMap()["source"]))
		}
	}
	return sources
}

// The reason this project exists: a tenant clicks "verify" and the worker starts
// within milliseconds, through the trigger's NOTIFY, not on the next poll (set to an
// hour here so that only a notification can explain the claim).
func TestWorker_ADomainVerifiedWhileRunningIsClaimedThroughNotify(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	in := startWorker(t, b.dsn, fake, queue.DefaultConfig(), queue.WorkerConfig{Concurrency: 2, PollInterval: time.Hour})
	tn := b.tenant(t)
	id := b.insert(t, tn, "pending", "pending", "acme")
	var name string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT domain FROM proxy_domains WHERE id = $1`, id).Scan(&name))
	// Let the start-up pass (reconnect) finish, so it cannot be what claims it.
	waitFor(t, 10*time.Second, "the start-up pass", func() bool {
		return in.logs.FilterMessage("pass finished").Len() > 0
	})
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET verification_status = 'verified' WHERE id = $1`, id)
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the domain to become active", func() bool { return b.status(t, id) == "active" })
	require.Equal(t, []string{listener.SourceNotify}, in.startedWith(name))
	require.Equal(t, 1, fake.Count(name))
}

// A retry scheduled for a backoff happens when the backoff runs out, through the
// worker's timer, not up to a poll interval late. The backoff after one failure is
// base * 2^1 (CONTRACT.md §5).
func TestWorker_AFailedDomainIsRetriedWhenItsBackoffRunsOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	fake.Fail = func(_ string, n int) error {
		if n == 1 {
			return errors.New("validation failed")
		}
		return nil
	}
	qcfg := queue.Config{RetryBase: time.Second, RetryMax: time.Hour, MaxAttempts: 10}
	startWorker(t, b.dsn, fake, qcfg, queue.WorkerConfig{Concurrency: 1, PollInterval: time.Hour})
	id, name := b.domain(t, b.tenant(t), "pending", 0, nil)
	first := <-fake.Calls()
	select {
	case second := <-fake.Calls():
		gap := second.At.Sub(first.At)
		want := qcfg.Backoff(1)
		require.InDelta(t, want.Seconds(), gap.Seconds(), 0.5, "retried after %s, want %s", gap, want)
	case <-time.After(30 * time.Second):
		t.Fatal("the failed domain was not retried")
	}
	waitFor(t, 10*time.Second, "the retry to succeed", func() bool { return b.status(t, id) == "active" })
	require.Equal(t, 2, fake.Count(name))
}

// SIGTERM (here: the context) mid-order: the order gets the grace, then is handed
// back, uncharged, and nothing is left in provisioning.
func TestWorker_StopHandsBackOrdersStillRunningAfterTheGrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	fake.Delay = time.Hour
	in := startWorker(t, b.dsn, fake, queue.DefaultConfig(), queue.WorkerConfig{Concurrency: 2, PollInterval: time.Hour, ShutdownGrace: time.Second})
	tn := b.tenant(t)
	id1, _ := b.domain(t, tn, "pending", 0, nil)
	id2, _ := b.domain(t, tn, "pending", 3, ago(24*3600))
	<-fake.Calls()
	<-fake.Calls()
	start := time.Now()
	in.stop()
	require.NoError(t, in.wait(t, 20*time.Second))
	require.Less(t, time.Since(start), 10*time.Second)
	for id, attempts := range map[string]int{id1: 0, id2: 3} {
		var status string
		var got int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ssl_status, ssl_attempts FROM proxy_domains WHERE id = $1`, id).Scan(&status, &got))
		require.Equal(t, "pending", status, "left in provisioning")
		require.Equal(t, attempts, got, "a hand-back was charged")
	}
	// Claimable at once by another instance.
	require.ElementsMatch(t, []string{id1, id2}, b.drain(t))
}

// An order that finishes inside the grace is recorded, not handed back.
func TestWorker_StopLetsOrdersFinishInsideTheGrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	fake.Delay = 500 * time.Millisecond
	in := startWorker(t, b.dsn, fake, queue.DefaultConfig(), queue.WorkerConfig{Concurrency: 1, PollInterval: time.Hour, ShutdownGrace: 10 * time.Second})
	id, _ := b.domain(t, b.tenant(t), "pending", 0, nil)
	<-fake.Calls()
	in.stop()
	require.NoError(t, in.wait(t, 20*time.Second))
	require.Equal(t, "active", b.status(t, id))
}

// Nothing the issuer does may crash the worker or leave a domain in provisioning:
// a panic is a failure, charged and retried like any other.
func TestWorker_AnIssuerPanicIsRecordedAsAFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	fake.Fail = func(string, int) error { return fakeissuer.ErrPanic }
	in := startWorker(t, b.dsn, fake, queue.DefaultConfig(), queue.WorkerConfig{Concurrency: 1, PollInterval: time.Hour})
	id, _ := b.domain(t, b.tenant(t), "pending", 0, nil)
	waitFor(t, 10*time.Second, "the failure to be recorded", func() bool {
		var attempts int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ssl_attempts FROM proxy_domains WHERE id = $1`, id).Scan(&attempts))
		return attempts == 1
	})
	require.Equal(t, "pending", b.status(t, id))
	var sslErr string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ssl_error FROM proxy_domains WHERE id = $1`, id).Scan(&sslErr))
	require.Contains(t, sslErr, "panicked")
	select {
	case <-in.done:
		t.Fatalf("the worker stopped: %v", in.err)
	default:
	}
}

// A name no CA can issue for fails at once and never reaches the issuer.
func TestWorker_AnInvalidNameFailsWithoutAnOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	startWorker(t, b.dsn, fake, queue.DefaultConfig(), queue.WorkerConfig{Concurrency: 1, PollInterval: time.Hour})
	tn := b.tenant(t)
	var id string
	require.NoError(t, b.pool.QueryRow(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
VALUES ($1, '*.wild.example', 'verified', 'tok', 'pending', 'acme') RETURNING id::text`, tn).Scan(&id))
	waitFor(t, 10*time.Second, "the domain to fail", func() bool { return b.status(t, id) == "failed" })
	var sslErr string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ssl_error FROM proxy_domains WHERE id = $1`, id).Scan(&sslErr))
	require.Regexp(t, `^invalid domain: `, sslErr)
	require.Empty(t, fake.Counts(), "an invalid name reached the issuer")
}

// A CA rate limit is not charged to the domain, and pauses the CA for every instance
// until Retry-After.
func TestWorker_ARateLimitIsNotChargedAndPausesTheCA(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	fake.Fail = func(_ string, n int) error {
		if n == 1 {
			return &queue.RateLimitError{RetryAfter: 2 * time.Second, Detail: "too many new orders"}
		}
		return nil
	}
	startWorker(t, b.dsn, fake, queue.DefaultConfig(), queue.WorkerConfig{Concurrency: 1, PollInterval: time.Hour})
	id, _ := b.domain(t, b.tenant(t), "pending", 0, nil)
	first := <-fake.Calls()
	var second fakeissuer.Call
	select {
	case second = <-fake.Calls():
	case <-time.After(20 * time.Second):
		t.Fatal("not retried after the pause")
	}
	require.GreaterOrEqual(t, second.At.Sub(first.At), 2*time.Second, "ordered again before Retry-After")
	waitFor(t, 10*time.Second, "the domain to become active", func() bool { return b.status(t, id) == "active" })
	var attempts int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM certworker_pauses`).Scan(&attempts))
	require.Equal(t, 1, attempts, "the pause was not stored in the database")
}

// Three instances, 500 domains verified in one transaction: every domain is issued
// exactly once. The claim query, not the wake-ups, is what keeps them apart.
func TestWorker_ThreeInstancesIssueEachDomainExactlyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(1)
	fake.Delay = 2 * time.Millisecond
	for i := range 3 {
		startWorker(t, b.dsn, fake, queue.DefaultConfig(), queue.WorkerConfig{Owner: fmt.Sprint("w", i), Concurrency: 4, PollInterval: time.Hour})
	}
	tn := b.tenant(t)
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
SELECT $1, 'many' || g || '.example', 'pending', 'tok', 'pending', 'acme' FROM generate_series(1, 500) g`, tn)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET verification_status = 'verified'`)
	require.NoError(t, err)
	waitFor(t, 60*time.Second, "all 500 domains to become active", func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM proxy_domains WHERE ssl_status = 'active'`).Scan(&n))
		return n == 500
	})
	counts := fake.Counts()
	require.Len(t, counts, 500)
	for d, n := range counts {
		require.Equal(t, 1, n, "%s ordered %d times", d, n)
	}
}
