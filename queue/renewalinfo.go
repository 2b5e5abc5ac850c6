package queue

import (
	"context"
	"fmt"
	"time"
)

// RenewalInfoCandidate is a stored certificate whose renewal information is due to be
// asked again.
type RenewalInfoCandidate struct {
	ID, Domain string
	ChainPEM   string
	NotBefore  time.Time
	NotAfter   time.Time
	RenewAt    time.Time
}

// RenewalInfoDue returns up to limit certificates whose renewal information is due to
// be asked again (ari_next_at passed), still valid, of active ACME domains that renew
// automatically, the longest waiting first.
func (q *Queue) RenewalInfoDue(ctx context.Context, limit int) ([]RenewalInfoCandidate, error) {
	rows, err := q.db.Query(ctx, `
SELECT c.id::text, c.domain, c.certificate_pem, COALESCE(c.not_before, c.expires_at), c.expires_at, c.renew_at
FROM proxy_certificates c JOIN proxy_domains d ON d.domain = c.domain
WHERE c.ari_next_at <= now() AND c.expires_at > now() AND c.renew_at IS NOT NULL AND c.auto_renew
  AND d.ssl_status = 'active' AND d.ssl_provider = 'acme'
ORDER BY c.ari_next_at LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("certificates due for renewal information: %w", err)
	}
	defer rows.Close()
	var out []RenewalInfoCandidate
	for rows.Next() {
		var c RenewalInfoCandidate
		if err := rows.Scan(&c.ID, &c.Domain, &c.ChainPEM, &c.NotBefore, &c.NotAfter, &c.RenewAt); err != nil {
			return nil, fmt.Errorf("certificates due for renewal information: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("certificates due for renewal information: %w", err)
	}
	return out, nil
}

// RenewalInfo is what the worker learnt of a stored certificate's renewal window.
type RenewalInfo struct {
	// RenewAt, when not zero, is an earlier renewal time than the stored one: the CA
	// moved its window earlier. A later window never postpones a renewal.
	RenewAt time.Time
	// WindowEnd is the end of the CA's window (zero: none). Past it the renewal is
	// urgent.
	WindowEnd time.Time
	// Next is when to ask again; zero stops asking (the CA offers no renewal
	// information).
	Next time.Time
}

// RecordRenewalInfo records what the CA said of certificate id's renewal window. A
// renewal time that moved earlier also moves the domain's urgency (ssl_renew_by),
// so that a certificate the CA is about to revoke is renewed before first issuances.
func (q *Queue) RecordRenewalInfo(ctx context.Context, id string, info RenewalInfo) error {
	_, err := q.db.Exec(ctx, `
WITH c AS (
    UPDATE proxy_certificates SET
        renew_at = LEAST(renew_at, $2),
        ari_window_end = COALESCE($3, ari_window_end),
        ari_next_at = $4
    WHERE id = $1
    RETURNING domain, renew_at, ari_window_end
)
UPDATE proxy_domains d SET ssl_renew_by = LEAST(d.ssl_renew_by, c.ari_window_end)
FROM c WHERE d.domain = c.domain AND c.ari_window_end IS NOT NULL`,
		id, nullTime(info.RenewAt), nullTime(info.WindowEnd), nullTime(info.Next))
	if err != nil {
		return fmt.Errorf("record renewal information: %w", err)
	}
	return nil
}
