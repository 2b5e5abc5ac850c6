package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
)

// A domain's history is bounded: housekeeping keeps its EventsPerDomain newest events
// and none older than EventsKeep (an event counted up since is as new as its last
// repeat), deleting more than one batch when there is more, and passing over a row
// another transaction holds rather than waiting for it.
func TestPrune_KeepsADomainsHistoryBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	busy, old := uuid.NewString(), uuid.NewString()
	b.exec(t, `INSERT INTO certworker_domain_events (domain_id, tenant_id, event, at, last_at)
SELECT $1, $2, 'claimed', now() - make_interval(secs => 200 - g), now() - make_interval(secs => 200 - g)
FROM generate_series(1, $3::int + 5) g`, busy, tenant, queue.EventsPerDomain)
	b.exec(t, `INSERT INTO certworker_domain_events (domain_id, tenant_id, event, at, last_at)
SELECT $1, $2, 'failed', now() - interval '91 days', now() - interval '91 days' FROM generate_series(1, 2500)`, old, tenant)
	b.exec(t, `INSERT INTO certworker_domain_events (domain_id, tenant_id, event, at, last_at, count)
VALUES ($1, $2, 'waiting_for_dns', now() - interval '91 days', now() - interval '1 day', 5000)`, old, tenant)
	newest := b.strings(t, `SELECT e.id::text FROM certworker_domain_events e WHERE e.domain_id = $1 ORDER BY e.id DESC LIMIT $2`,
		busy, queue.EventsPerDomain)

	// A row of old's held by an open transaction is passed over, not waited for.
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.Background())
	var lockedID string
	require.NoError(t, tx.QueryRow(b.ctx, `SELECT id::text FROM certworker_domain_events
WHERE domain_id = $1 AND event = 'failed' ORDER BY id LIMIT 1 FOR UPDATE`, old).Scan(&lockedID))

	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	r, err := b.q.Prune(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 5+2499, r.Events)
	require.ElementsMatch(t, newest, b.strings(t, `SELECT id::text FROM certworker_domain_events WHERE domain_id = $1`, busy),
		"the domain's newest events are kept, the older deleted")
	require.ElementsMatch(t, []string{"failed", "waiting_for_dns"},
		b.strings(t, `SELECT event FROM certworker_domain_events WHERE domain_id = $1`, old),
		"the locked row and the event repeated yesterday are kept")
	require.NoError(t, tx.Rollback(b.ctx))
	r, err = b.q.Prune(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, r.Events, "the row passed over goes at the next run")
}
