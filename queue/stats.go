package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

// ExpiryWindows are the windows FleetStats counts unrenewed expiries in: 7 days is
// what a 90-day certificate renewing at 30 days left should never reach, 3 days
// leaves a working day or two, 1 day is the last call.
var ExpiryWindows = []time.Duration{7 * 24 * time.Hour, 3 * 24 * time.Hour, 24 * time.Hour}

// PendingTooLong is the age past which a queued domain counts in PendingOverHour: an
// order takes minutes, and the backoff reaches an hour only after six failures.
const PendingTooLong = time.Hour

// statsTimeout bounds each statement of FleetStats, so a slow pass is abandoned
// rather than left holding a snapshot open.
const statsTimeout = "10s"

// FleetStats is the fleet's state for alerts, from one snapshot: counts and times
// only, so the metrics do not grow with the domains.
type FleetStats struct {
	// At is the database's clock at the snapshot.
	At time.Time
	// Domains counts acme domains by ssl_status; every status has a key.
	Domains map[string]int
	// Verified counts the verified acme domains, Valid those with an unexpired
	// certificate: Valid/Verified is the SLO.
	Verified, Valid int
	// NextExpiry is the earliest expiry among those valid certificates (nil: none).
	NextExpiry *time.Time
	// ExpiringUnrenewed[i] counts verified acme domains expiring within
	// ExpiryWindows[i] with no renewal under way.
	ExpiringUnrenewed []int
	// PendingOverHour counts domains queued more than PendingTooLong ago.
	PendingOverHour int
	// Paused counts queued domains held back by a pause in force, by scope.
	Paused map[string]int
	// CAPausedUntil is when the directory's CA-wide pause ends (nil: not paused).
	CAPausedUntil *time.Time
	// LedgerOrders counts the directory's orders in the orders_per_account window,
	// against LedgerLimit; nil while that limit is off.
	LedgerOrders, LedgerLimit *int
	// Replace is the progress of replacing certificates whose renewal window has started.
	Replace issuing.ReplaceProgress
	// Totals are the counts behind Domains["active"] and Verified, and when counted.
	Totals FleetTotals

	invalid      int           // verified acme domains holding no valid certificate at At
	totalsMaxAge time.Duration // how old reused Totals may be
}

// FleetTotals are the figures only a read of every acme domain gives, so a caller
// may count them less often (FleetStatsReusing).
type FleetTotals struct {
	// At is the database's clock when they were counted.
	At time.Time
	// Active counts the active acme domains; Verified the verified ones.
	Active, Verified int
}

// FleetStats reads the fleet's state for the alert metrics, on a timer: FleetTotals
// reads an index of all acme domains; the rest reads only unsettled rows, the queue,
// the pauses and the ledger.
func (q *Queue) FleetStats(ctx context.Context, directory string) (FleetStats, error) {
	return q.FleetStatsReusing(ctx, directory, nil, 0)
}

// FleetStatsReusing is FleetStats reusing last's Totals while younger than maxAge;
// Valid then subtracts the verified domains without a valid certificate now, so an
// expiry shows at once.
func (q *Queue) FleetStatsReusing(ctx context.Context, directory string, last *FleetTotals, maxAge time.Duration) (FleetStats, error) {
	s := FleetStats{
		Domains:      map[string]int{"pending": 0, "provisioning": 0, "active": 0, "failed": 0},
		Paused:       map[string]int{issuing.ScopeCA: 0, issuing.ScopeRegisteredDomain: 0, issuing.ScopeDomain: 0},
		totalsMaxAge: maxAge,
	}
	if last != nil {
		s.Totals = *last
	}
	tx, err := q.db.Begin(ctx)
	if err != nil {
		return s, fmt.Errorf("fleet statistics: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only
	// One snapshot, so the figures add up.
	if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"); err != nil {
		return s, fmt.Errorf("fleet statistics: %w", err)
	}
	if _, err := tx.Exec(ctx, "SET LOCAL statement_timeout = '"+statsTimeout+"'"); err != nil {
		return s, fmt.Errorf("fleet statistics: %w", err)
	}
	for _, step := range []func(context.Context, pgx.Tx, *FleetStats, string) error{
		readStatusCounts, readTotals, readExpiringUnrenewed, readPendingOverHour, readPauses, readLedger, readReplace,
	} {
		if err := step(ctx, tx, &s, directory); err != nil {
			return s, fmt.Errorf("fleet statistics: %w", err)
		}
	}
	return s, nil
}

// statusCountsSQL reads only the unsettled rows: the non-active acme domains by
// status, the verified ones with no unexpired certificate, and the next expiry.
var statusCountsSQL = `
SELECT now(), u.pending, u.provisioning, u.failed,
       (SELECT count(*) FROM proxy_domains
        WHERE ` + managedSQL("") + ` AND ssl_expires_at IS NULL)
     + (SELECT count(*) FROM proxy_domains
        WHERE ` + managedSQL("") + ` AND ssl_expires_at <= now()),
       (SELECT min(ssl_expires_at) FROM proxy_domains
        WHERE ` + managedSQL("") + ` AND ssl_expires_at > now())
FROM (SELECT count(*) FILTER (WHERE ssl_status = 'pending') AS pending,
             count(*) FILTER (WHERE ssl_status = 'provisioning') AS provisioning,
             count(*) FILTER (WHERE ssl_status = 'failed') AS failed
      FROM proxy_domains WHERE ssl_provider = 'acme' AND ssl_status <> 'active') u`

// totalsSQL counts FleetTotals with an index-only scan of proxy_domains_fleet_idx.
// FILTER rather than GROUP BY: the index leads with the expiry, so grouping would hash.
const totalsSQL = `
SELECT now(), count(*) FILTER (WHERE ssl_status = 'active'), count(*) FILTER (WHERE verification_status = 'verified')
FROM proxy_domains
WHERE ssl_provider = 'acme'`

func readStatusCounts(ctx context.Context, tx pgx.Tx, s *FleetStats, _ string) error {
	var pending, provisioning, failed, invalid int
	if err := tx.QueryRow(ctx, statusCountsSQL).Scan(&s.At, &pending, &provisioning, &failed,
		&invalid, &s.NextExpiry); err != nil {
		return fmt.Errorf("count domains: %w", err)
	}
	s.Domains["pending"], s.Domains["provisioning"], s.Domains["failed"] = pending, provisioning, failed
	s.invalid = invalid
	return nil
}

// readTotals counts FleetTotals afresh unless s.Totals is younger than
// s.totalsMaxAge.
func readTotals(ctx context.Context, tx pgx.Tx, s *FleetStats, _ string) error {
	if s.Totals.At.IsZero() || s.At.Sub(s.Totals.At) >= s.totalsMaxAge {
		if err := tx.QueryRow(ctx, totalsSQL).Scan(&s.Totals.At, &s.Totals.Active, &s.Totals.Verified); err != nil {
			return fmt.Errorf("count domains: %w", err)
		}
	}
	s.Domains["active"], s.Verified = s.Totals.Active, s.Totals.Verified
	s.Valid = max(0, s.Verified-s.invalid)
	return nil
}

// expiringUnrenewedSQL counts per window ($1, seconds; $2 the longest) the verified
// acme certificates expiring inside it with no renewal under way, without reading the
// healthy majority.
var expiringUnrenewedSQL = `
WITH late AS MATERIALIZED (
    SELECT d.ssl_expires_at AS expires
    FROM proxy_domains d
    WHERE ` + managedSQL("d") + `
      AND (d.ssl_status = 'failed' OR (d.ssl_status = 'pending' AND d.ssl_attempts > 0))
      AND d.ssl_expires_at > now()
      AND d.ssl_expires_at <= now() + make_interval(secs => $2)
    UNION ALL
    SELECT d.ssl_expires_at
    FROM proxy_certificates c
    JOIN proxy_domains d ON d.domain = c.domain
    WHERE c.auto_renew AND c.renew_at < now() - interval '1 hour'
      AND ` + managedSQL("d") + `
      AND d.ssl_status = 'active'
      AND d.ssl_expires_at > now()
      AND d.ssl_expires_at <= now() + make_interval(secs => $2)
)
SELECT array_agg((SELECT count(*) FROM late WHERE expires <= now() + make_interval(secs => w)) ORDER BY i)
FROM unnest($1::float8[]) WITH ORDINALITY AS u(w, i)`

func readExpiringUnrenewed(ctx context.Context, tx pgx.Tx, s *FleetStats, _ string) error {
	windows := make([]float64, len(ExpiryWindows))
	for i, w := range ExpiryWindows {
		windows[i] = w.Seconds()
	}
	var counts []int
	if err := tx.QueryRow(ctx, expiringUnrenewedSQL, windows, slices.Max(windows)).Scan(&counts); err != nil {
		return fmt.Errorf("count certificates expiring without renewal: %w", err)
	}
	s.ExpiringUnrenewed = counts
	return nil
}

// pendingOverHourSQL counts the rows queued more than $1 seconds ago.
var pendingOverHourSQL = `
SELECT count(*) FROM proxy_domains
WHERE ` + claimableAsSQL("") + `
  AND COALESCE(ssl_queued_at, updated_at) < now() - make_interval(secs => $1)`

func readPendingOverHour(ctx context.Context, tx pgx.Tx, s *FleetStats, _ string) error {
	if err := tx.QueryRow(ctx, pendingOverHourSQL, PendingTooLong.Seconds()).Scan(&s.PendingOverHour); err != nil {
		return fmt.Errorf("count domains pending too long: %w", err)
	}
	return nil
}

// pausesSQL counts the queued domains each scope of pause of the CA at $1 holds back,
// matching keys as the claim does (the suffix match as a string comparison, cheaper
// than certworker_suffixes' array), reading the queue only while a pause is in force.
var pausesSQL = `
WITH p AS MATERIALIZED (
    SELECT scope, key, paused_until FROM certworker_pauses
    WHERE paused_until > now() AND (scope = 'ca' AND key = $1 OR scope <> 'ca' AND directory IN ($1, ''))
), queued AS MATERIALIZED (
    SELECT lower(domain) AS name FROM proxy_domains
    WHERE ` + claimableAsSQL("") + `
      AND EXISTS (SELECT 1 FROM p)
)
SELECT
    (SELECT max(paused_until) FROM p WHERE scope = 'ca'),
    (SELECT count(*) FROM queued WHERE EXISTS (SELECT 1 FROM p WHERE scope = 'ca')),
    (SELECT count(*) FROM queued q
     WHERE EXISTS (SELECT 1 FROM p WHERE scope = 'registered_domain' AND strpos(p.key, '.') > 0
                                    AND (q.name = p.key OR right(q.name, length(p.key) + 1) = '.' || p.key))),
    (SELECT count(*) FROM queued q
     WHERE EXISTS (SELECT 1 FROM p WHERE scope = 'domain' AND p.key = q.name))`

func readPauses(ctx context.Context, tx pgx.Tx, s *FleetStats, directory string) error {
	var ca, regd, dom int
	if err := tx.QueryRow(ctx, pausesSQL, directory).Scan(&s.CAPausedUntil, &ca, &regd, &dom); err != nil {
		return fmt.Errorf("count paused domains: %w", err)
	}
	s.Paused[issuing.ScopeCA], s.Paused[issuing.ScopeRegisteredDomain], s.Paused[issuing.ScopeDomain] = ca, regd, dom
	return nil
}

// ledgerSQL reads the recorded orders_per_account limit and counts the directory's
// orders in its window that reached the CA.
const ledgerSQL = `
SELECT lim.count,
       (SELECT count(*)::int FROM certworker_ledger l
        WHERE l.directory = $1 AND l.outcome <> 'not_sent'
          AND l.at > now() - make_interval(secs => lim.window_seconds))
FROM certworker_settings s,
     LATERAL (SELECT (s.limits -> 'orders_per_account' ->> 'count')::int AS count,
                     (s.limits -> 'orders_per_account' ->> 'window_seconds')::float8 AS window_seconds) lim
WHERE s.id AND lim.count IS NOT NULL AND lim.window_seconds IS NOT NULL`

func readLedger(ctx context.Context, tx pgx.Tx, s *FleetStats, directory string) error {
	var limit, used int
	err := tx.QueryRow(ctx, ledgerSQL, directory).Scan(&limit, &used)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("read the order ledger: %w", err)
	}
	s.LedgerLimit, s.LedgerOrders = &limit, &used
	return nil
}

func readReplace(ctx context.Context, tx pgx.Tx, s *FleetStats, directory string) error {
	p, err := readReplaceProgress(ctx, tx, []string{directory})
	s.Replace = p
	return err
}
