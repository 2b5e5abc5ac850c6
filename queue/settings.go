package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The wake modes (`certworker run --wake`, certworker_settings.wake).
const (
	// WakeNotify: the trigger notifies and the worker listens.
	WakeNotify = "notify"
	// WakeLogical: the trigger does not notify; the worker reads a logical
	// replication stream.
	WakeLogical = "logical"
)

// SetWakeMode records mode (WakeNotify or WakeLogical) in certworker_settings, which
// decides whether the wake trigger notifies, and returns the mode that was in force
// before (WakeNotify where none was recorded). `certworker run` calls it once its wake
// source has started.
//
// It writes only when the mode changes, so that a worker in notify mode, the default,
// needs nothing on certworker_settings beyond reading it; switching needs INSERT and
// UPDATE on it.
//
// The setting is shared by every instance on the database: an instance still running
// in notify mode after another set logical hears no more notifications and wakes only
// on its timer and poll until it is restarted with --wake logical. A caller that sees
// the mode change should say so.
func (q *Queue) SetWakeMode(ctx context.Context, mode string) (previous string, err error) {
	if mode != WakeNotify && mode != WakeLogical {
		return "", fmt.Errorf("set wake mode: %q is neither %s nor %s", mode, WakeNotify, WakeLogical)
	}
	current := WakeNotify
	err = q.db.QueryRow(ctx, `SELECT wake FROM certworker_settings WHERE id`).Scan(&current)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("read wake mode: %w", err)
	}
	if current == mode {
		return current, nil
	}
	// The CTE reads the row as it was before the statement, so that an instance
	// switching at the same moment is reported too.
	var prev *string
	err = q.db.QueryRow(ctx, `
WITH old AS (SELECT wake FROM certworker_settings WHERE id)
INSERT INTO certworker_settings (id, wake, updated_at) VALUES (true, $1, now())
ON CONFLICT (id) DO UPDATE SET wake = EXCLUDED.wake, updated_at = EXCLUDED.updated_at
RETURNING (SELECT wake FROM old)`, mode).Scan(&prev)
	if err != nil {
		return "", fmt.Errorf("record wake mode in certworker_settings (the worker's role needs INSERT and UPDATE on it to switch modes): %w", err)
	}
	if prev == nil {
		return WakeNotify, nil
	}
	return *prev, nil
}

// Limit is one ledger limit: at most Count orders in any window of Window. The zero
// Limit is off.
type Limit struct {
	Count  int
	Window time.Duration
}

// Off reports whether the limit is off.
func (l Limit) Off() bool { return l.Count <= 0 || l.Window <= 0 }

// String is the flag's form: COUNT/DURATION, or off.
func (l Limit) String() string {
	if l.Off() {
		return "off"
	}
	return strconv.Itoa(l.Count) + "/" + l.Window.String()
}

// ParseLimit reads a --limit-* value: COUNT/DURATION (a Go duration), or off.
func ParseLimit(s string) (Limit, error) {
	s = strings.TrimSpace(s)
	if s == "off" {
		return Limit{}, nil
	}
	count, window, ok := strings.Cut(s, "/")
	if !ok {
		return Limit{}, fmt.Errorf("%q is not COUNT/DURATION or off", s)
	}
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 {
		return Limit{}, fmt.Errorf("%q: the count must be a whole number of at least 1", s)
	}
	d, err := time.ParseDuration(window)
	if err != nil || d <= 0 {
		return Limit{}, fmt.Errorf("%q: the window must be a positive Go duration such as 3h", s)
	}
	return Limit{Count: n, Window: d}, nil
}

// Limits are the ledger's limits, mirrors of the CA's published ones (CONTRACT.md §3).
type Limits struct {
	OrdersPerAccount         Limit
	CertsPerRegisteredDomain Limit
	CertsPerExactSet         Limit
	FailedAuthzPerName       Limit
	// TenantReserve is --limit-tenant-reserve, the share of OrdersPerAccount kept for
	// the other tenants (reserve.go); 0 is off.
	TenantReserve float64
}

// Any reports whether any limit is on.
func (l Limits) Any() bool {
	return !l.OrdersPerAccount.Off() || !l.CertsPerRegisteredDomain.Off() ||
		!l.CertsPerExactSet.Off() || !l.FailedAuthzPerName.Off()
}

// Longest is the longest window of the limits that are on (0 when all are off): how
// long ledger rows are worth keeping.
func (l Limits) Longest() time.Duration {
	return max(l.OrdersPerAccount.window(), l.CertsPerRegisteredDomain.window(),
		l.CertsPerExactSet.window(), l.FailedAuthzPerName.window())
}

func (l Limit) window() time.Duration {
	if l.Off() {
		return 0
	}
	return l.Window
}

// jsonLimit is a Limit as certworker_settings.limits stores it.
type jsonLimit struct {
	Count         int     `json:"count"`
	WindowSeconds float64 `json:"window_seconds"`
}

func (l Limit) toJSON() *jsonLimit {
	if l.Off() {
		return nil
	}
	return &jsonLimit{Count: l.Count, WindowSeconds: l.Window.Seconds()}
}

func (j *jsonLimit) limit() Limit {
	if j == nil {
		return Limit{}
	}
	return Limit{Count: j.Count, Window: time.Duration(j.WindowSeconds * float64(time.Second))}
}

type jsonLimits struct {
	OrdersPerAccount         *jsonLimit `json:"orders_per_account"`
	CertsPerRegisteredDomain *jsonLimit `json:"certs_per_registered_domain"`
	CertsPerExactSet         *jsonLimit `json:"certs_per_exact_set"`
	FailedAuthzPerName       *jsonLimit `json:"failed_authz_per_name"`
	TenantReserve            float64    `json:"tenant_reserve,omitempty"`
}

// MarshalJSON is the form certworker_settings.limits stores (a limit that is off is
// null).
func (l Limits) MarshalJSON() ([]byte, error) {
	return json.Marshal(jsonLimits{
		l.OrdersPerAccount.toJSON(), l.CertsPerRegisteredDomain.toJSON(),
		l.CertsPerExactSet.toJSON(), l.FailedAuthzPerName.toJSON(), l.TenantReserve,
	})
}

// UnmarshalJSON reads certworker_settings.limits.
func (l *Limits) UnmarshalJSON(b []byte) error {
	var j jsonLimits
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*l = Limits{j.OrdersPerAccount.limit(), j.CertsPerRegisteredDomain.limit(),
		j.CertsPerExactSet.limit(), j.FailedAuthzPerName.limit(), j.TenantReserve}
	return nil
}

// FleetSettings are the settings every instance must share: the backoff curve that
// `status` reports next attempts by, and the ledger's limits.
type FleetSettings struct {
	RetryBase   time.Duration
	RetryMax    time.Duration
	MaxAttempts int
	Limits      Limits
}

// RecordSettings writes s as the fleet's settings and returns what was recorded
// before (ok false when nothing was). `certworker run` calls it at start, so the last
// instance started decides, as for --wake; an instance that sees them change should
// say so in its log, since the others keep their own flags until they restart.
func (q *Queue) RecordSettings(ctx context.Context, s FleetSettings) (prev FleetSettings, ok bool, err error) {
	limits, err := json.Marshal(s.Limits)
	if err != nil {
		return prev, false, fmt.Errorf("record settings: %w", err)
	}
	var old storedSettings
	err = q.db.QueryRow(ctx, `
WITH old AS (SELECT retry_base_seconds, retry_max_seconds, max_attempts, limits FROM certworker_settings WHERE id)
INSERT INTO certworker_settings (id, retry_base_seconds, retry_max_seconds, max_attempts, limits, updated_at)
VALUES (true, $1, $2, $3, $4, now())
ON CONFLICT (id) DO UPDATE SET
    retry_base_seconds = EXCLUDED.retry_base_seconds, retry_max_seconds = EXCLUDED.retry_max_seconds,
    max_attempts = EXCLUDED.max_attempts, limits = EXCLUDED.limits, updated_at = EXCLUDED.updated_at
RETURNING (SELECT retry_base_seconds FROM old), (SELECT retry_max_seconds FROM old),
    (SELECT max_attempts FROM old), (SELECT limits FROM old)`,
		seconds(s.RetryBase), seconds(s.RetryMax), s.MaxAttempts, limits).Scan(old.dest()...)
	if err != nil {
		return prev, false, fmt.Errorf("record settings in certworker_settings: %w", err)
	}
	return old.settings()
}

// storedSettings is a certworker_settings row's settings columns, all NULL until a
// worker has recorded them.
type storedSettings struct {
	base, capSecs *float64
	attempts      *int
	limits        []byte
}

func (s *storedSettings) dest() []any { return []any{&s.base, &s.capSecs, &s.attempts, &s.limits} }

func (s *storedSettings) settings() (FleetSettings, bool, error) {
	if s.base == nil || s.capSecs == nil || s.attempts == nil {
		return FleetSettings{}, false, nil
	}
	f := FleetSettings{RetryBase: secondsDuration(*s.base), RetryMax: secondsDuration(*s.capSecs), MaxAttempts: *s.attempts}
	if len(s.limits) > 0 {
		if err := json.Unmarshal(s.limits, &f.Limits); err != nil {
			return f, false, fmt.Errorf("read recorded limits: %w", err)
		}
	}
	return f, true, nil
}

// Settings reads the fleet's settings; ok is false when no worker has recorded any.
func (q *Queue) Settings(ctx context.Context) (s FleetSettings, ok bool, err error) {
	var stored storedSettings
	err = q.db.QueryRow(ctx, `
SELECT retry_base_seconds, retry_max_seconds, max_attempts, limits FROM certworker_settings WHERE id`).
		Scan(stored.dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, false, nil
	}
	if err != nil {
		return s, false, fmt.Errorf("read settings: %w", err)
	}
	return stored.settings()
}

func secondsDuration(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// RecordDNS01Zone records --dns01-zone in certworker_settings ("" records that DNS-01
// is off), where certworker_dns01_target reads it: the database does not know the
// flag. It writes only when the value changes. As for the other settings, the last
// instance started decides.
func (q *Queue) RecordDNS01Zone(ctx context.Context, zone string) error {
	zone = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(zone), "."))
	var stored *string
	if zone != "" {
		stored = &zone
	}
	_, err := q.db.Exec(ctx, `
INSERT INTO certworker_settings (id, dns01_zone, updated_at) VALUES (true, $1, now())
ON CONFLICT (id) DO UPDATE SET dns01_zone = EXCLUDED.dns01_zone, updated_at = EXCLUDED.updated_at
WHERE certworker_settings.dns01_zone IS DISTINCT FROM EXCLUDED.dns01_zone`, stored)
	if err != nil {
		return fmt.Errorf("record --dns01-zone in certworker_settings: %w", err)
	}
	return nil
}
