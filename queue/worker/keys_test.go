package worker_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zapcore"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// An order that finds a stored key the instance cannot open (issuing.KeyError: another
// instance sealed the account key under a key this one lacks) is handed back
// uncharged (pending, attempts and error untouched, claimable at once), the instance
// logs the key id it lacks and claims nothing more, however often it is woken, and
// Halted says why (/readyz 503). Another instance that holds the key issues both
// domains. Guards against every due domain being charged "not in
// --key-encryption-key" until all had failed, by a worker that still reported ready.
func TestWorker_AKeyErrorIsNotChargedAndStopsTheInstanceClaiming(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keyErr := &issuing.KeyError{Key: "ACME account key of " + workertest.Directory, KeyID: "0a1b2c3d",
		Err: errors.New("the key is sealed under a key encryption key that is not in --key-encryption-key (key id 0a1b2c3d)")}
	stale := fakeissuer.New(10)
	stale.Fail = func(string, int) error { return fmt.Errorf("acme: %w", keyErr) }
	in := b.start(t, "stale", worker.Config{Issuer: stale, Concurrency: 2, PollInterval: time.Hour})
	in.WaitForLog(t, "pass finished", 1, 10*time.Second)
	tn := b.tenant(t)
	id1, name1 := b.domain(t, tn)
	stale.Next(t, 10*time.Second)
	workertest.Eventually(t, 10*time.Second, "the order's end to be recorded", func() bool { return b.row(t, id1).Owner == nil })

	r := b.row(t, id1)
	require.Equal(t, "pending", r.Status)
	require.Zero(t, r.Attempts, "the key error was charged")
	require.Nil(t, r.Error, "a key id reached ssl_error, which the tenant sees")
	require.Nil(t, r.Owner)
	var halted *issuing.KeyError
	require.True(t, errors.As(in.Halted(), &halted))
	require.Equal(t, "0a1b2c3d", halted.KeyID)
	stopped := in.Logs.FilterMessageSnippet("it claims nothing more").All()
	require.Len(t, stopped, 1)
	require.Equal(t, zapcore.ErrorLevel, stopped[0].Level)
	require.Equal(t, "0a1b2c3d", stopped[0].ContextMap()["key_id"])
	in.WaitForMetric(t, 1, 10*time.Second, "certworker_issuance_total", "key_error")
	in.WaitForLog(t, "order handed back: a stored key does not open; not charged", 1, 10*time.Second)

	// Another domain falls due, and notifications wake the instance (each one sent
	// after the count is read starts a pass after it): it claims neither.
	id2, _ := b.domain(t, tn)
	passes := in.Metric(t, "certworker_wakeups_total", listener.SourceNotify)
	workertest.Eventually(t, 10*time.Second, "a pass after the second domain", func() bool {
		_, err := b.pool.Exec(b.ctx, "NOTIFY "+listener.Channel)
		require.NoError(t, err)
		return in.Metric(t, "certworker_wakeups_total", listener.SourceNotify) > passes
	})
	require.Equal(t, map[string]int{name1: 1}, stale.Counts(), "the instance claimed after its key error")
	require.Equal(t, "pending", b.status(t, id2))
	require.Equal(t, 1.0, in.Metric(t, "certworker_claims_total", listener.SourceNotify))

	b.start(t, "with-key", worker.Config{Issuer: fakeissuer.New(10), Concurrency: 2, PollInterval: time.Hour})
	b.waitStatus(t, id1, "active", 10*time.Second)
	b.waitStatus(t, id2, "active", 10*time.Second)
	require.NotNil(t, in.Halted(), "ready again without a restart")
}
