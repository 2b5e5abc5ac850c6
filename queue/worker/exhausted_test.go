package worker_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// A domain at or above --max-attempts, which no claim takes, is marked failed by the
// maintenance, with its last error and why it stopped. It waited in 'pending' for
// ever, never tried and never failed.
func TestWorker_ADomainAtTheAttemptLimitIsMarkedFailed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakeissuer.New(10)
	id, name := b.domain(t, b.tenant(t))
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_attempts = 3, ssl_error = 'validation failed' WHERE id = $1`, id)
	require.NoError(t, err)
	in := b.start(t, "w", worker.Config{Issuer: fake, Queue: issuing.Config{MaxAttempts: 3}, PollInterval: time.Hour})
	b.waitStatus(t, id, "failed", 10*time.Second)
	require.Equal(t, "validation failed (given up: 3 attempts, at or above --max-attempts 3; `certworker retry` puts it back)",
		*b.row(t, id).Error)
	require.Zero(t, fake.Count(name))
	in.WaitForLog(t, "domain at or above --max-attempts, which no claim takes; marked failed", 1, time.Second)
}
