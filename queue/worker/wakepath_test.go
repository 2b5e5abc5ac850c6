package worker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/worker"
)

// A pass woken by a notification claims from the rows in line as they stand, without
// bringing held rows back first (the row it was woken for is in line already). A row
// held out of line for its backoff still comes back when the backoff ends while
// notifications keep waking the worker faster than its timer's retry (every 2 ms,
// each pass resetting the timer): the pass after one that found something due it did
// not claim brings held rows back first. Guards against a retry held off for as long
// as the wake-ups go on.
func TestWorker_AHeldRowComesBackWhileNotificationsKeepComing(t *testing.T) {
	t.Parallel()
	d := newBenchDB(t)
	ids := d.insertDomains(t, 1, "verified")
	fake := fakeissuer.New(16)
	fake.Set(func(f *fakeissuer.Issuer) {
		f.Fail = func(_ string, n int) error {
			if n == 1 {
				return errors.New("the CA said no, this once")
			}
			return nil
		}
	})
	workertest.Start(t, d.dsn, "held", worker.Config{Issuer: fake, Concurrency: 4, PollInterval: time.Hour,
		Queue: queue.Config{RetryBase: 300 * time.Millisecond, RetryMax: 300 * time.Millisecond, MaxAttempts: 5}})
	workertest.Eventually(t, 30*time.Second, "the first order fails and holds the row out of line", func() bool {
		var held *string
		require.NoError(t, d.pool.QueryRow(d.ctx, `SELECT ssl_held FROM proxy_domains WHERE id = $1`, ids[0]).Scan(&held))
		return fake.Count("bench1.example") == 1 && held != nil && *held == "backoff"
	})

	ctx, stop := context.WithCancel(d.ctx)
	streamDone := make(chan int)
	go func() {
		sent := 0
		defer func() { streamDone <- sent }()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for end := time.Now().Add(time.Minute); time.Now().Before(end); {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if _, err := d.pool.Exec(ctx, `SELECT pg_notify('certworker_wake', '')`); err != nil {
				return
			}
			sent++
		}
	}()
	workertest.Eventually(t, 2*time.Minute, "the held row claimed again", func() bool {
		return fake.Count("bench1.example") == 2
	})
	select {
	case <-streamDone:
		t.Fatal("the held row came back only once the notifications stopped")
	default:
	}
	stop()
	t.Logf("notifications sent before the retry: %d", <-streamDone)
	workertest.Eventually(t, 30*time.Second, "the row active", func() bool { return d.countActive(t) == 1 })
}
