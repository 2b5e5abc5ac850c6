package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

// RefusedError is a retry the domain's state does not allow; its message says why.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return e.Reason }

// AmbiguousError is a name matching case twins pickTwin cannot choose between.
type AmbiguousError struct {
	Name    string
	Matches []NameMatch
}

// NameMatch is one of the domains an ambiguous name matches.
type NameMatch struct{ ID, Domain string }

func (e *AmbiguousError) Error() string {
	names := make([]string, len(e.Matches))
	for i, m := range e.Matches {
		names[i] = fmt.Sprintf("%s (%s)", m.Domain, m.ID)
	}
	return fmt.Sprintf("%s matches %d domains that differ only in case: %s; delete all but one first",
		e.Name, len(e.Matches), strings.Join(names, ", "))
}

type named struct {
	id, tenantID, domain, verification, provider, status string
	keeps                                                bool
}

var lookUpSQL = `
SELECT id::text, tenant_id::text, domain, verification_status, ssl_provider, ssl_status,
    ` + twinCountsSQL("d") + ` AND ` + keepsNameSQL("d") + `
FROM proxy_domains d WHERE lower(domain) = lower($1) ORDER BY domain FOR UPDATE`

// lookUp finds the one domain called name, in any case, locking it for tx:
// ErrNotFound or an *AmbiguousError otherwise.
func lookUp(ctx context.Context, tx pgx.Tx, name string) (named, error) {
	rows, err := tx.Query(ctx, lookUpSQL, name)
	if err != nil {
		return named{}, fmt.Errorf("look up %s: %w", name, err)
	}
	found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (named, error) {
		var n named
		err := r.Scan(&n.id, &n.tenantID, &n.domain, &n.verification, &n.provider, &n.status, &n.keeps)
		return n, err
	})
	if err != nil {
		return named{}, fmt.Errorf("look up %s: %w", name, err)
	}
	if len(found) == 0 {
		return named{}, issuing.ErrNotFound
	}
	i, err := pickTwin(name, len(found), func(i int) (string, string, bool) {
		return found[i].id, found[i].domain, found[i].keeps
	})
	if err != nil {
		return named{}, err
	}
	return found[i], nil
}

// pickTwin chooses which of n rows matching name in any case an operator means: the
// only row, else the one spelled exactly so, else the one that keeps the name
// (keepsNameSQL); else an *AmbiguousError.
func pickTwin(name string, n int, at func(i int) (id, domain string, keeps bool)) (int, error) {
	if n == 1 {
		return 0, nil
	}
	keeper := -1
	for i := range n {
		_, domain, keeps := at(i)
		if domain == name {
			return i, nil
		}
		if keeps {
			keeper = i
		}
	}
	if keeper >= 0 {
		return keeper, nil
	}
	amb := &AmbiguousError{Name: name}
	for i := range n {
		id, domain, _ := at(i)
		amb.Matches = append(amb.Matches, NameMatch{ID: id, Domain: domain})
	}
	return 0, amb
}

var retrySQL = `SELECT count(*) FROM certworker_queue_for_issuance($1, $2)`

// Retry puts a failed or backing-off domain back in the queue now, by name in any
// case, through certworker_queue_for_issuance: attempts, error and every CA's refusal
// cleared. It refuses with a *RefusedError a domain unknown, not verified, not acme,
// active or being issued, and with an *AmbiguousError a name case twins hold.
func (q *Queue) Retry(ctx context.Context, domain string) error {
	return pgx.BeginFunc(ctx, q.db, func(tx pgx.Tx) error {
		d, err := lookUp(ctx, tx, domain)
		if errors.Is(err, issuing.ErrNotFound) {
			return &RefusedError{fmt.Sprintf("%s: unknown domain", domain)}
		}
		if err != nil {
			return err
		}
		switch {
		case d.verification != "verified":
			return &RefusedError{fmt.Sprintf("%s: not verified (verification_status %s); a certificate is only ordered for a verified domain", d.domain, d.verification)}
		case d.provider != "acme":
			return &RefusedError{fmt.Sprintf("%s: its certificate does not come from ACME (ssl_provider %s)", d.domain, d.provider)}
		case d.status == "active":
			return &RefusedError{fmt.Sprintf("%s: already active; it is renewed on its own schedule", d.domain)}
		case d.status == "provisioning":
			return &RefusedError{fmt.Sprintf("%s: being issued right now", d.domain)}
		}
		var queued int
		if err := tx.QueryRow(ctx, retrySQL,
			d.id, d.tenantID).Scan(&queued); err != nil {
			return fmt.Errorf("retry %s: %w", d.domain, err)
		}
		if queued != 1 {
			return fmt.Errorf("retry %s: the domain was not queued", d.domain)
		}
		return nil
	})
}

var queueForIssuanceSQL = `SELECT count(*) FROM certworker_queue_for_issuance($1, $2)`

// QueueForIssuance is the proxy API's "retry", certworker_queue_for_issuance. It
// reports whether the domain was queued (false, changing nothing, when the function
// refuses).
func (q *Queue) QueueForIssuance(ctx context.Context, id, tenantID string) (bool, error) {
	var queued int
	if err := q.db.QueryRow(ctx, queueForIssuanceSQL,
		id, tenantID).Scan(&queued); err != nil {
		return false, fmt.Errorf("queue for issuance: %w", err)
	}
	return queued == 1, nil
}

// Domain is a proxy_domains row as the proxy's API shows it.
type Domain struct {
	ID                 string
	TenantID           string
	Domain             string
	VerificationStatus string
	VerificationMethod string
	SSLStatus          string
	SSLProvider        string
	SSLAttempts        int
	SSLError           *string
	SSLLastAttemptAt   *time.Time
	SSLExpiresAt       *time.Time
	// SSLProfile is the domain's own ACME profile; nil is --acme-profile.
	SSLProfile *string
}

const domainColumns = `id::text, tenant_id::text, domain, verification_status, verification_method,
    ssl_status, ssl_provider, ssl_attempts, ssl_error, ssl_last_attempt_at, ssl_expires_at, ssl_profile`

func scanDomain(row pgx.Row) (*Domain, error) {
	var d Domain
	err := row.Scan(&d.ID, &d.TenantID, &d.Domain, &d.VerificationStatus, &d.VerificationMethod,
		&d.SSLStatus, &d.SSLProvider, &d.SSLAttempts, &d.SSLError, &d.SSLLastAttemptAt, &d.SSLExpiresAt, &d.SSLProfile)
	if err != nil {
		return nil, err
	}
	return &d, nil
}

var updateDomainSQL = `
SELECT ` + domainColumns + ` FROM certworker_update_domain($1, $2, $3, $4)`

// UpdateDomain is the proxy API's domain update, certworker_update_domain: nil
// fields are left alone, and a provider change resets the SSL state to 'pending'.
// nil, nil when the domain is not the tenant's.
func (q *Queue) UpdateDomain(ctx context.Context, id, tenantID string, method, provider *string) (*Domain, error) {
	d, err := scanDomain(q.db.QueryRow(ctx, updateDomainSQL, id, tenantID, method, provider))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("update domain: %w", err)
	}
	return d, nil
}
