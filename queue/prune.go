package queue

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// LedgerWindow is how long the ledger rows of the CA at Directory are kept (Prune):
// the longest window of its limits.
type LedgerWindow struct {
	Directory string
	Window    time.Duration
}

// PruneResult is how many rows Prune deleted, by kind.
type PruneResult struct {
	// Tokens: HTTP-01 challenge tokens past their expiry (left by an instance that
	// died mid-order; a live order deletes its own).
	Tokens int64
	// Pauses: pauses that ended more than pauseKeep ago.
	Pauses int64
	// Ledger: orders older than the longest limit window.
	Ledger int64
	// Tenants: the order-of-service counters of tenants with no domain left.
	Tenants int64
	// Certificates: certificate rows, with their private keys, of deleted domains.
	Certificates int64
	// IssuedNames: the ledger's record that a CA issued for a name, for names no
	// domain has any more.
	IssuedNames int64
	// Events: events of domains' histories older than EventsKeep, or beyond a
	// domain's EventsPerDomain newest.
	Events int64
}

const (
	// pauseKeep is how long an ended pause is kept: `status` and operators can still
	// see why ordering stopped yesterday, and a CA that was unreachable and fails again
	// within the day resumes its backoff where it left off.
	pauseKeep = 24 * time.Hour
	// defaultLedgerWindow is the ledger's history when certworker_settings.limits says
	// nothing (no worker has started, or every limit is off): the longest of the
	// default limits, 50 certificates per registered domain in 168 hours.
	defaultLedgerWindow = 168 * time.Hour
	// orphanGrace is how long a certificate row whose domain does not exist is kept
	// after it was last written, so that a proxy that stores a certificate before the
	// domain row (or deletes and adds a domain again) is not raced.
	orphanGrace = time.Hour
	// EventsKeep and EventsPerDomain bound a domain's history (docs/domain-status.md):
	// enough to answer a tenant's "what happened" over a quarter, while a
	// million domains keep a bounded table.
	EventsKeep      = 90 * 24 * time.Hour
	EventsPerDomain = 100
	// eventsRecent is how far back Prune looks for the domains that gained events,
	// the only ones that can hold more than EventsPerDomain: several housekeeping
	// runs, so that runs missed (an instance restarting, the duty moving) leave none
	// out. A domain left out while housekeeping stopped longer is trimmed after its
	// next event.
	eventsRecent = time.Hour
	// pruneBatch is how many rows one statement deletes: short transactions, short
	// row locks, however much there is to delete after years without pruning.
	pruneBatch = 1000
)

// Prune deletes what the worker keeps and no longer needs, so that nothing grows
// without bound. Safe on any instance at any time, and concurrently: every statement
// deletes only rows nothing will read again. For a maintenance timer (every few
// minutes); the first run on the proxy's database after years may have much to do,
// and does it in batches of pruneBatch rows.
//
// A deleted domain's certificate row and private key are deleted here, an hour after
// the row was last written: the proxy deletes the domain (proxy_certificates has no
// foreign key to it), and the key should not outlive it. The name is compared in any
// case, as the proxy looks certificates up.
//
// A ledger row is kept for the longest window of its own CA's limits: keep gives
// them, by directory (the worker passes each CA's, whose --acme-fallback-limit-* may
// be longer than the first CA's). A row is never pruned before the longest window
// certworker_settings records either, which is the first CA's as the fleet last
// recorded it; a CA keep does not name has only that.
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
		// unlocked: no transaction of anyone's locks these rows, and the workers hold
		// no UPDATE right on the table, which SELECT ... FOR UPDATE needs.
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
     WHERE s.id AND jsonb_typeof(s.limits) = 'object' AND jsonb_typeof(l.value) = 'object'),
    $1), (SELECT max(k.secs) FROM unnest($2::text[], $3::float8[]) AS k (directory, secs)
          WHERE k.directory = g.directory)))`, []any{seconds(defaultLedgerWindow), dirs, windows}, false},
		{"counters of tenants without domains", &r.Tenants, "certworker_tenants", `
SELECT t.ctid FROM certworker_tenants t
WHERE NOT EXISTS (SELECT 1 FROM proxy_domains d WHERE d.tenant_id = t.tenant_id)`, nil, true},
		{"certificates of deleted domains", &r.Certificates, "proxy_certificates", `
SELECT c.ctid FROM proxy_certificates c
WHERE c.updated_at < now() - make_interval(secs => $1)
  AND NOT EXISTS (SELECT 1 FROM proxy_domains d WHERE lower(d.domain) = lower(c.domain))`,
			[]any{seconds(orphanGrace)}, false},
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

// deleteInBatches deletes the rows of table that match (a query of their ctids),
// pruneBatch at a time, and returns how many. A row that changed between the
// query and the delete has another ctid and is left for the next run: it was
// written, so it may be needed (a tenant's counter taken by a new domain). A row
// another transaction holds locked (the proxy's open write to a certificate row) is
// passed over and left for the next run, not waited for (skipLocked; a table nobody
// locks, and on which the workers may not lock, is read without it).
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
