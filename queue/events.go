package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// eventSQL calls certworker_domain_event for the row x of proxy_domains (an alias, as
// the statement leaves it), recording event (an SQL expression) with reason and
// message (SQL expressions, NULL for none) at the transaction's time. A statement
// that changes a domain records the event in its RETURNING, so that the event commits
// with the change or not at all (docs/domain-status.md, "Events").
func eventSQL(x, event, reason, message string) string {
	return `certworker_domain_event(` + x + `.id, ` + x + `.tenant_id, ` + event + `, ` + reason + `, ` + message + `, now())`
}

// reasonSQL is the reason code of the row x's ssl_error (certworker_domain_reason).
func reasonSQL(x string) string {
	return `certworker_domain_reason(` + x + `.ssl_error)`
}

// failedReasonSQL is the reason code of a failure of the row x as a failure write
// leaves it: too_many_failures when it was given up ('failed') for a cause with no
// code of its own, else its ssl_error's.
func failedReasonSQL(x string) string {
	return `CASE WHEN ` + x + `.ssl_status = 'failed' AND ` + reasonSQL(x) + ` = 'validation_failed'
             THEN 'too_many_failures' ELSE ` + reasonSQL(x) + ` END`
}

// DomainStatus is a row of certworker_domain_status: a domain's state as the proxy
// shows it to its tenant (docs/domain-status.md).
type DomainStatus struct {
	DomainID    string     `json:"domain_id"`
	Domain      string     `json:"domain"`
	State       string     `json:"state"`
	Reason      *string    `json:"reason"`
	Message     *string    `json:"message"`
	NextCheckAt *time.Time `json:"next_check_at"`
	PointTo     string     `json:"point_to"`
	CNAMETarget *string    `json:"cname_target"`
	Challenge   *string    `json:"challenge"`
	ExpiresAt   *time.Time `json:"expires_at"`
	RenewAt     *time.Time `json:"renew_at"`
}

var domainStatusSQL = `
SELECT domain_id::text, domain, state, reason, message, next_check_at, point_to, cname_target, challenge,
    expires_at, renew_at
FROM certworker_domain_status($1, $2)`

// DomainStatus is certworker_domain_status for the domain id of tenant: nil, with no
// error, for another tenant's domain or an unknown id.
func (q *Queue) DomainStatus(ctx context.Context, id, tenantID string) (*DomainStatus, error) {
	var s DomainStatus
	err := q.db.QueryRow(ctx, domainStatusSQL, id, tenantID).Scan(&s.DomainID, &s.Domain, &s.State, &s.Reason,
		&s.Message, &s.NextCheckAt, &s.PointTo, &s.CNAMETarget, &s.Challenge, &s.ExpiresAt, &s.RenewAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read domain status: %w", err)
	}
	return &s, nil
}

// Event is one event of a domain's history (certworker_domain_events).
type Event struct {
	ID       int64     `json:"id"`
	DomainID string    `json:"domain_id,omitempty"`
	At       time.Time `json:"at"`
	Event    string    `json:"event"`
	Reason   *string   `json:"reason"`
	Message  *string   `json:"message"`
	// Count is how many times the event came in a row, LastAt when it came last.
	Count  int       `json:"count"`
	LastAt time.Time `json:"last_at"`
}

var domainEventsSQL = `
SELECT id, at, event, reason, message, count, last_at FROM certworker_domain_events($1, $2, $3)`

// Events is the history of the domain id of tenant, newest first, at most limit
// events (certworker_domain_events); none for another tenant's domain.
func (q *Queue) Events(ctx context.Context, id, tenantID string, limit int) ([]Event, error) {
	rows, err := q.db.Query(ctx, domainEventsSQL, id, tenantID, limit)
	if err != nil {
		return nil, fmt.Errorf("read domain history: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		err := r.Scan(&e.ID, &e.At, &e.Event, &e.Reason, &e.Message, &e.Count, &e.LastAt)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("read domain history: %w", err)
	}
	return append([]Event{}, out...), nil
}

var domainEventsSinceSQL = `
SELECT id, domain_id::text, at, event, reason, message, count, last_at FROM certworker_domain_events_since($1, $2, $3)`

// EventsSince is the tenant's events after the id after, oldest first, at most limit
// (certworker_domain_events_since).
func (q *Queue) EventsSince(ctx context.Context, tenantID string, after int64, limit int) ([]Event, error) {
	rows, err := q.db.Query(ctx, domainEventsSinceSQL, tenantID, after, limit)
	if err != nil {
		return nil, fmt.Errorf("read the tenant's events: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		err := r.Scan(&e.ID, &e.DomainID, &e.At, &e.Event, &e.Reason, &e.Message, &e.Count, &e.LastAt)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the tenant's events: %w", err)
	}
	return append([]Event{}, out...), nil
}

var notifyDomainsSQL = `SELECT count(pg_notify('certworker_domain', id)) FROM unnest($1::text[]) AS id`

// NotifyDomains sends NOTIFY certworker_domain for each domain id, in a transaction
// of its own: the claim records its events without a notification
// (certworker_domain_record), so that its commit does not take the database's
// notification lock, and the worker calls this once the claim has committed.
func (q *Queue) NotifyDomains(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := q.db.Exec(ctx, notifyDomainsSQL, ids); err != nil {
		return fmt.Errorf("notify certworker_domain: %w", err)
	}
	return nil
}
