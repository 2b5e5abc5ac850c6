package worker_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/queue/worker"
)

// nextMaintenanceMarker is a piece of NextMaintenance's statement.
const nextMaintenanceMarker = "min(ssl_renew_by)"

// A certificate whose renewal information is due but whose domain is not active (it
// failed; its renewal is under way) does not keep the maintenance awake: were it left
// due, the timer would fire at once, again and again, for as long as the domain
// stayed failed.
func TestWorker_ADueReadOfAFailedDomainDoesNotKeepTheMaintenanceAwake(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.domain(t, b.tenant(t))
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_status = 'failed', ssl_attempts = 10 WHERE id = $1`, id)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at, not_before, renew_at, ari_next_at)
VALUES ($1, 'pem', 'key', now() + interval '30 days', now() - interval '60 days', now() + interval '1 day',
        now() - interval '1 minute')`, name)
	require.NoError(t, err)
	db := &faultDB{Pool: b.pool}
	db.watch(nextMaintenanceMarker)
	in := b.start(t, "w", worker.Config{DB: db, Issuer: fakeissuer.New(10), PollInterval: time.Hour})
	in.WaitForLog(t, "pass finished", 1, 10*time.Second)
	start := db.count(nextMaintenanceMarker)
	time.Sleep(time.Second) // long enough for a maintenance that wakes at once to show
	require.LessOrEqual(t, db.count(nextMaintenanceMarker)-start, 2, "maintenance runs in a second")
}
