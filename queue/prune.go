package queue

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// LedgerWindow is how long the ledger rows of the CA at Directory are kept.
type LedgerWindow struct {
	Directory string
	Window    time.Duration
}

// PruneResult is how many rows Prune deleted, by kind.
type PruneResult struct {
	// Tokens: HTTP-01 challenge tokens past their expiry.
	Tokens int64
	// Pauses: pauses that ended more than pauseKeep ago.
	Pauses int64
	// Ledger: orders older than the longest limit window.
	Ledger int64
	// Tenants: the order-of-service counters of tenants with no domain left.
	Tenants int64
	// Certificates: certificate rows, with their private keys, of deleted domains.
	Certificates int64
	// Buckets: the ledger's buckets full again (their tat past).
	Buckets int64
	// IssuedNames: the ledger's issued-name records of names no domain has.
	IssuedNames int64
	// Orders: recorded ACME orders of deleted domains.
	Orders int64
	// Events: events of domains' histories older than EventsKeep, or beyond a
	// domain's EventsPerDomain newest.
	Events int64
}

const (
	// pauseKeep is how long an ended pause is kept, for `status` and for a CA failing
	// again within the day to resume its backoff.
	pauseKeep = 24 * time.Hour
	// defaultLedgerWindow is the ledger's history when no limits are recorded.
	defaultLedgerWindow = 168 * time.Hour
	// orphanGrace keeps a certificate row without a domain this long after its last
	// write, so a proxy storing it before the domain row is not raced.
	orphanGrace = time.Hour
	// EventsKeep and EventsPerDomain bound a domain's history (docs/domain-status.md).
	EventsKeep      = 90 * 24 * time.Hour
	EventsPerDomain = 100
	// eventsRecent is how far back Prune looks for the domains that gained events, the
	// only ones that can hold more than EventsPerDomain; one left out while
	// housekeeping stopped longer is trimmed after its next event.
	eventsRecent = time.Hour
	// pruneBatch is how many rows one statement deletes.
	pruneBatch = 1000
)

// Prune deletes what the worker keeps and no longer needs, in batches; safe on any
// instance at any time. A deleted domain's certificate row and key go an hour after
// their last write, matched by name in any case. A ledger row is kept for the longest
// window of its CA's limits (keep; Limits.Longest leaves out the failures in a row,
// for which no row is read), and of those certworker_settings records.
func (q *Queue) Prune(ctx context.Context, keep ...LedgerWindow) (PruneResult, error) {
	dirs, windows := make([]string, len(keep)), make([]float64, len(keep))
	for i, k := range keep {
		dirs[i], windows[i] = k.Directory, seconds(k.Window)
	}
	var r PruneResult
	var errs []error
	var events [2]int64 // old, and beyond a domain's newest
	for _, step := range []struct {
		what  string
		count *int64
		table string
		sql   string
		args  []any
		// unlocked: nobody locks these rows, and the workers may not lock them.
		unlocked bool
	}{
		{"expired HTTP-01 tokens", &r.Tokens, "certworker_http01_tokens", `
SELECT ctid FROM certworker_http01_tokens WHERE expires_at < now()`, nil, false},
		{"ended pauses", &r.Pauses, "certworker_pauses", `
SELECT ctid FROM certworker_pauses WHERE paused_until < now() - make_interval(secs => $1)`,
			[]any{seconds(pauseKeep)}, false},
		{"old ledger rows", &r.Ledger, "certworker_ledger", `
SELECT g.ctid FROM certworker_ledger g WHERE g.at < now() - make_interval(secs => GREATEST(COALESCE(
    (SELECT max((l.value->>'window_seconds')::double precision)
     FROM certworker_settings s, jsonb_each(s.limits) AS l
     WHERE s.id AND jsonb_typeof(s.limits) = 'object' AND jsonb_typeof(l.value) = 'object'
       AND l.key <> 'consecutive_failures'),
    $1), (SELECT max(k.secs) FROM unnest($2::text[], $3::float8[]) AS k (directory, secs)
          WHERE k.directory = g.directory)))`, []any{seconds(defaultLedgerWindow), dirs, windows}, false},
		{"full buckets", &r.Buckets, "certworker_buckets", `
SELECT ctid FROM certworker_buckets WHERE tat < now()`, nil, false},
		{"counters of tenants without domains", &r.Tenants, "certworker_tenants", `
SELECT t.ctid FROM certworker_tenants t
WHERE NOT EXISTS (SELECT 1 FROM proxy_domains d WHERE d.tenant_id = t.tenant_id)`, nil, true},
		{"certificates of deleted domains", &r.Certificates, "proxy_certificates", `
SELECT c.ctid FROM proxy_certificates c
WHERE c.updated_at < now() - make_interval(secs => $1)
  AND NOT EXISTS (SELECT 1 FROM proxy_domains d WHERE lower(d.domain) = lower(c.domain))`,
			[]any{seconds(orphanGrace)}, false},
		{"recorded orders of deleted domains", &r.Orders, "certworker_orders", `
SELECT o.ctid FROM certworker_orders o
WHERE NOT EXISTS (SELECT 1 FROM proxy_domains d WHERE d.id = o.domain_id)`, nil, false},
		{"names issued for deleted domains", &r.IssuedNames, "certworker_issued_names", `
SELECT n.ctid FROM certworker_issued_names n
WHERE n.issued_at < now() - make_interval(secs => $1)
  AND NOT EXISTS (SELECT 1 FROM proxy_domains d WHERE lower(d.domain) = n.name)`,
			[]any{seconds(orphanGrace)}, false},
		{"old domain events", &events[0], "certworker_domain_events", pruneOldEventsSQL,
			[]any{seconds(EventsKeep)}, false},
		{"domain events beyond a domain's newest", &events[1], "certworker_domain_events", pruneExtraEventsSQL,
			[]any{seconds(eventsRecent), EventsPerDomain}, false},
	} {
		n, err := q.deleteInBatches(ctx, step.table, step.sql, step.args, !step.unlocked)
		*step.count = n
		if err != nil {
			// The other kinds do not wait on this one.
			errs = append(errs, fmt.Errorf("prune %s: %w", step.what, err))
		}
	}
	r.Events = events[0] + events[1]
	return r, errors.Join(errs...)
}

// pruneOldEventsSQL finds the events last written more than $1 seconds ago, through
// the index on at (an event's at is never after its last_at).
var pruneOldEventsSQL = `
SELECT e.ctid FROM certworker_domain_events e
WHERE e.at < now() - make_interval(secs => $1) AND e.last_at < now() - make_interval(secs => $1)`

// pruneExtraEventsSQL finds the events beyond the $2 newest of each domain that gained
// events in the last $1 seconds: the domains through the index on at, each one's
// events through its index on (domain_id, id).
var pruneExtraEventsSQL = `
SELECT e.ctid FROM certworker_domain_events e
WHERE e.domain_id IN (SELECT r.domain_id FROM certworker_domain_events r WHERE r.at > now() - make_interval(secs => $1))
  AND e.id < (SELECT n.id FROM certworker_domain_events n WHERE n.domain_id = e.domain_id
              ORDER BY n.id DESC OFFSET $2 - 1 LIMIT 1)`

// deleteInBatches deletes the rows of table that match (by ctid), pruneBatch at a
// time; a row changed meanwhile or locked is left for the next run.
func (q *Queue) deleteInBatches(ctx context.Context, table, match string, args []any, skipLocked bool) (int64, error) {
	lock := ""
	if skipLocked {
		lock = " FOR UPDATE SKIP LOCKED"
	}
	var total int64
	for {
		tag, err := q.db.Exec(ctx, fmt.Sprintf(`
DELETE FROM %s WHERE ctid = ANY (ARRAY(%s LIMIT %d%s))`, table, match, pruneBatch, lock), args...)
		if err != nil {
			return total, err
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < pruneBatch {
			return total, nil
		}
	}
}
