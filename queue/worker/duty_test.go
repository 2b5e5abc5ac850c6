package worker_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue/worker"
)

// The maintenance is the fleet's: one instance does it, the holder of the duty. A
// second instance started beside it does not run the housekeeping an instance runs at
// its first maintenance (an expired HTTP-01 token is left for the holder's next
// housekeeping), until the holder stops, which hands the duty on: then it takes the
// duty over and runs it. Guards against every instance of a fleet at rest
// running the same maintenance (what a fleet of three cost the database three times
// over), and against a stopped holder's duty waiting out its lease.
func TestMaintenance_OneInstanceOfTheFleetRunsItAndAnotherTakesOver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := worker.Config{Issuer: fakeissuer.New(1), Concurrency: 1, PollInterval: time.Second}
	first := b.start(t, "first", cfg)
	holder := func() string {
		var h string
		if err := b.pool.QueryRow(b.ctx, `SELECT holder FROM certworker_fleet_duties WHERE duty = 'maintenance'`).Scan(&h); err != nil {
			return ""
		}
		return h
	}
	workertest.Eventually(t, 30*time.Second, "the first instance holds the duty", func() bool { return holder() == first.Owner() })
	// Its first run's housekeeping is over once it reaches the reclaim.
	first.WaitForLog(t, "reclaim waits for the database to have been up a full lease", 1, 30*time.Second)
	tokens := func() int {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM certworker_http01_tokens`).Scan(&n))
		return n
	}
	_, err := b.pool.Exec(b.ctx, `INSERT INTO certworker_http01_tokens (token, key_authorization, domain, expires_at)
        VALUES ('expired-token', 'ka', 'gone.example', now() - interval '1 hour')`)
	require.NoError(t, err)

	second := b.start(t, "second", cfg)
	second.WaitForLog(t, "maintenance left to the instance holding the duty", 2, 30*time.Second)
	require.Equal(t, 1, tokens(), "the second instance ran the housekeeping the first holds the duty for")
	require.Equal(t, first.Owner(), holder())

	// A clean stop hands the duty on: the second takes it at its next look (the poll
	// interval, 1 s), not when the lease (60 s) runs out.
	require.NoError(t, first.Stop(t, 30*time.Second))
	workertest.Eventually(t, 20*time.Second, "the second instance takes the duty over", func() bool { return holder() == second.Owner() })
	workertest.Eventually(t, 30*time.Second, "its housekeeping prunes the expired token", func() bool { return tokens() == 0 })
}
