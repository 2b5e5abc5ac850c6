package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

var wakeModeSQL = `SELECT wake FROM certworker_settings WHERE id`

var setWakeModeSQL = `
WITH old AS (SELECT wake FROM certworker_settings WHERE id)
INSERT INTO certworker_settings (id, wake, updated_at) VALUES (true, $1, now())
ON CONFLICT (id) DO UPDATE SET wake = EXCLUDED.wake, updated_at = EXCLUDED.updated_at
RETURNING (SELECT wake FROM old)`

// SetWakeMode records mode in certworker_settings, which decides whether the wake
// trigger notifies, and returns the previous mode (WakeNotify when none); it writes
// only on a change. The setting is the fleet's: an instance left on notify wakes only
// on its timer and poll, so a caller seeing a change should say so.
func (q *Queue) SetWakeMode(ctx context.Context, mode string) (previous string, err error) {
	if mode != issuing.WakeNotify && mode != issuing.WakeLogical {
		return "", fmt.Errorf("set wake mode: %q is neither %s nor %s", mode, issuing.WakeNotify, issuing.WakeLogical)
	}
	current := issuing.WakeNotify
	err = q.db.QueryRow(ctx, wakeModeSQL).Scan(&current)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("read wake mode: %w", err)
	}
	if current == mode {
		return current, nil
	}
	// The CTE reads the row as it was, reporting a concurrent switch too.
	var prev *string
	err = q.db.QueryRow(ctx, setWakeModeSQL, mode).Scan(&prev)
	if err != nil {
		return "", fmt.Errorf("record wake mode in certworker_settings (the worker's role needs INSERT and UPDATE on it to switch modes): %w", err)
	}
	if prev == nil {
		return issuing.WakeNotify, nil
	}
	return *prev, nil
}

// FleetSettings are the settings every instance must share: the backoff curve and
// the ledger's limits.
type FleetSettings struct {
	RetryBase   time.Duration
	RetryMax    time.Duration
	MaxAttempts int
	Limits      issuing.Limits
}

var recordSettingsSQL = `
WITH old AS (SELECT retry_base_seconds, retry_max_seconds, max_attempts, limits FROM certworker_settings WHERE id)
INSERT INTO certworker_settings (id, retry_base_seconds, retry_max_seconds, max_attempts, limits, updated_at)
VALUES (true, $1, $2, $3, $4, now())
ON CONFLICT (id) DO UPDATE SET
    retry_base_seconds = EXCLUDED.retry_base_seconds, retry_max_seconds = EXCLUDED.retry_max_seconds,
    max_attempts = EXCLUDED.max_attempts, limits = EXCLUDED.limits, updated_at = EXCLUDED.updated_at
RETURNING (SELECT retry_base_seconds FROM old), (SELECT retry_max_seconds FROM old),
    (SELECT max_attempts FROM old), (SELECT limits FROM old)`

// RecordSettings writes s as the fleet's settings and returns the previous ones (ok
// false when none); the last instance started decides, as for --wake.
func (q *Queue) RecordSettings(ctx context.Context, s FleetSettings) (prev FleetSettings, ok bool, err error) {
	limits, err := json.Marshal(s.Limits)
	if err != nil {
		return prev, false, fmt.Errorf("record settings: %w", err)
	}
	var old storedSettings
	err = q.db.QueryRow(ctx, recordSettingsSQL,
		seconds(s.RetryBase), seconds(s.RetryMax), s.MaxAttempts, limits).Scan(old.dest()...)
	if err != nil {
		return prev, false, fmt.Errorf("record settings in certworker_settings: %w", err)
	}
	return old.settings()
}

// storedSettings are certworker_settings' settings columns, NULL until recorded.
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

var settingsSQL = `
SELECT retry_base_seconds, retry_max_seconds, max_attempts, limits FROM certworker_settings WHERE id`

// Settings reads the fleet's settings; ok is false when no worker has recorded any.
func (q *Queue) Settings(ctx context.Context) (s FleetSettings, ok bool, err error) {
	var stored storedSettings
	err = q.db.QueryRow(ctx, settingsSQL).
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

var recordDNS01ZoneSQL = `
INSERT INTO certworker_settings (id, dns01_zone, updated_at) VALUES (true, $1, now())
ON CONFLICT (id) DO UPDATE SET dns01_zone = EXCLUDED.dns01_zone, updated_at = EXCLUDED.updated_at
WHERE certworker_settings.dns01_zone IS DISTINCT FROM EXCLUDED.dns01_zone`

var recordDNSTargetSQL = `
INSERT INTO certworker_settings (id, dns_target, updated_at) VALUES (true, $1, now())
ON CONFLICT (id) DO UPDATE SET dns_target = EXCLUDED.dns_target, updated_at = EXCLUDED.updated_at
WHERE certworker_settings.dns_target IS DISTINCT FROM EXCLUDED.dns_target`

// RecordDNSTarget records --dns-target in certworker_settings ("" records none), which
// certworker_domain_status shows tenants as what to point their names at. It writes
// only when the value changes; the last instance started decides.
func (q *Queue) RecordDNSTarget(ctx context.Context, target string) error {
	var stored *string
	if target = strings.TrimSpace(target); target != "" {
		stored = &target
	}
	if _, err := q.db.Exec(ctx, recordDNSTargetSQL, stored); err != nil {
		return fmt.Errorf("record --dns-target in certworker_settings: %w", err)
	}
	return nil
}

// RecordDNS01Zone records --dns01-zone ("": off) for certworker_dns01_target, when it
// changes.
func (q *Queue) RecordDNS01Zone(ctx context.Context, zone string) error {
	zone = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(zone), "."))
	var stored *string
	if zone != "" {
		stored = &zone
	}
	_, err := q.db.Exec(ctx, recordDNS01ZoneSQL, stored)
	if err != nil {
		return fmt.Errorf("record --dns01-zone in certworker_settings: %w", err)
	}
	return nil
}
