package queue

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/certworker/certworker/queue/issuing"
)

// MarkRenewals moves active domains whose certificate is due for renewal
// (proxy_certificates.renew_at) back to 'pending', and reports how many; rows
// without a renewal time first get one from their PEM (fillRenewalTimes). A
// certificate the proxy cannot serve for its domain makes the domain due for issuance
// now, and the row is returned in Bad. The two parts run whatever became of the
// other; their errors are joined. Locked rows wait for the next pass.
func (q *Queue) MarkRenewals(ctx context.Context) (issuing.RenewalPass, error) {
	var pass issuing.RenewalPass
	fillErr := q.fillRenewalTimes(ctx, &pass)
	marked, err := q.requeueDue(ctx)
	pass.Marked += marked
	return pass, errors.Join(fillErr, err)
}

func (q *Queue) fillRenewalTimes(ctx context.Context, pass *issuing.RenewalPass) error {
	for after := ""; ; {
		batch, err := q.readUnscheduled(ctx, after)
		if err != nil || len(batch) == 0 {
			return err
		}
		after = batch[len(batch)-1].id
		marked, bad, err := q.schedule(ctx, batch)
		pass.Marked += marked
		pass.Bad = append(pass.Bad, bad...)
		if err != nil {
			return err
		}
	}
}

var requeueDueSQL = `
WITH due AS (
    SELECT d.id, LEAST(
        CASE WHEN c.not_before IS NULL THEN c.renew_at
             WHEN c.expires_at IS NOT NULL THEN c.expires_at - (c.expires_at - c.not_before) / 5
             WHEN c.renew_at - c.not_before >= make_interval(secs => $2) THEN c.renew_at + (c.renew_at - c.not_before) / 5
             ELSE c.renew_at + (c.renew_at - c.not_before) * 3 / 5 END,
        c.ari_window_end) AS renew_by
    FROM proxy_domains d JOIN proxy_certificates c ON c.domain = d.domain
    WHERE c.auto_renew AND c.renew_at <= now()
      AND d.ssl_status = 'active'
      AND d.ssl_provider = 'acme'
      AND d.verification_status = 'verified'
    LIMIT $1
    FOR UPDATE OF d SKIP LOCKED)
UPDATE proxy_domains d SET
    ssl_status = 'pending', ssl_attempts = 0, updated_at = now(), ssl_renew_by = due.renew_by
FROM due
WHERE d.id = due.id`

// requeueDue moves the active domains whose renewal time has passed back to
// 'pending' with a clean attempt count and ssl_renew_by (RenewBy), from which the
// wake trigger gives the tier.
//
// Where expires_at is NULL, renew_at came from RenewAtFromValidity, so the lifetime L
// follows from D = renew_at - not_before: D = 2L/3 from 10 days (D >= 6.67 days),
// D = L/2 below (D < 5 days), and the fifth before expiry is renew_at + D/5 or
// renew_at + 3D/5. With no lifetime, renew_at itself.
func (q *Queue) requeueDue(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := q.db.Exec(ctx, requeueDueSQL, fillBatch, seconds(2*issuing.ShortLived/3))
		if err != nil {
			return total, fmt.Errorf("mark renewals: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < fillBatch {
			return total, nil
		}
	}
}

type unscheduled struct {
	id, domain, chain string
	// domainID and tenantID are "" when the row's domain does not exist.
	domainID, tenantID string
}

// fillBatch is how many rows one statement of the renewal pass reads or requeues,
// bounding the PEMs in memory and the locks held.
const fillBatch = 1000

var readUnscheduledSQL = `
SELECT c.id::text, c.domain, c.certificate_pem, COALESCE(d.id::text, ''), COALESCE(d.tenant_id::text, '')
FROM proxy_certificates c LEFT JOIN proxy_domains d ON d.domain = c.domain
WHERE c.renew_at IS NULL AND c.auto_renew AND c.id > $1::uuid
ORDER BY c.id LIMIT $2`

func (q *Queue) readUnscheduled(ctx context.Context, after string) ([]unscheduled, error) {
	if after == "" {
		after = "00000000-0000-0000-0000-000000000000"
	}
	rows, err := q.db.Query(ctx, readUnscheduledSQL, after, fillBatch)
	if err != nil {
		return nil, fmt.Errorf("read certificates without a renewal time: %w", err)
	}
	defer rows.Close()
	var out []unscheduled
	for rows.Next() {
		var u unscheduled
		if err := rows.Scan(&u.id, &u.domain, &u.chain, &u.domainID, &u.tenantID); err != nil {
			return nil, fmt.Errorf("read certificates without a renewal time: %w", err)
		}
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read certificates without a renewal time: %w", err)
	}
	return out, nil
}

var scheduleSQL = `
WITH f AS (
    SELECT * FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[], $4::text[], $5::text[])
        AS f (id, renew_at, not_before, issuer, serial)
), free AS (
    SELECT c.id FROM proxy_certificates c
    WHERE c.id IN (SELECT id FROM f) AND c.renew_at IS NULL
    FOR UPDATE SKIP LOCKED)
UPDATE proxy_certificates c SET
    renew_at = f.renew_at,
    not_before = COALESCE(c.not_before, f.not_before),
    issuer = COALESCE(c.issuer, f.issuer),
    serial = COALESCE(c.serial, f.serial)
FROM f JOIN free USING (id)
WHERE c.id = f.id`

// schedule gives each row of the batch its renewal time from its leaf and marks the
// domains of the rows it cannot use due for issuance.
func (q *Queue) schedule(ctx context.Context, batch []unscheduled) (int64, []issuing.BadRow, error) {
	var ids, issuers, serials []string
	var renewAts, notBefores []time.Time
	var badIDs, reasons []string
	var bad []issuing.BadRow
	for _, u := range batch {
		leaf, reason := judge(u.chain, u.domain)
		if reason != "" {
			badIDs, reasons = append(badIDs, u.id), append(reasons, reason)
			bad = append(bad, issuing.BadRow{ID: u.domainID, TenantID: u.tenantID, Domain: u.domain, Reason: reason})
			continue
		}
		ids = append(ids, u.id)
		renewAts = append(renewAts, issuing.RenewAtFromValidity(leaf.NotBefore, leaf.NotAfter))
		notBefores = append(notBefores, leaf.NotBefore)
		issuers = append(issuers, leaf.Issuer.String())
		serials = append(serials, leaf.SerialNumber.Text(16))
	}
	if len(ids) > 0 {
		if _, err := q.db.Exec(ctx, scheduleSQL, ids, renewAts, notBefores, issuers, serials); err != nil {
			return 0, nil, fmt.Errorf("record renewal times: %w", err)
		}
	}
	if len(badIDs) == 0 {
		return 0, nil, nil
	}
	for i := range reasons {
		reasons[i] = q.errorText(ctx, reasons[i])
	}
	marked, err := q.requeueForIssuance(ctx, badIDs, reasons)
	return marked, bad, err
}

var requeueForIssuanceSQL = `
WITH b AS (
    SELECT * FROM unnest($1::uuid[], $2::text[]) AS b (id, reason)
), free AS (
    SELECT c.id FROM proxy_certificates c
    WHERE c.id IN (SELECT id FROM b) AND c.renew_at IS NULL
    FOR UPDATE SKIP LOCKED
), c AS (
    UPDATE proxy_certificates c SET renew_at = now()
    FROM b JOIN free USING (id)
    WHERE c.id = b.id
    RETURNING c.domain, b.reason
), d AS (
    SELECT d.id, c.reason FROM proxy_domains d JOIN c ON d.domain = c.domain
    WHERE d.ssl_status = 'active'
      AND d.ssl_provider = 'acme'
      AND d.verification_status = 'verified'
    FOR UPDATE OF d SKIP LOCKED)
UPDATE proxy_domains x SET
    ssl_status = 'pending', ssl_attempts = 0, ssl_error = d.reason, ssl_renew_by = NULL,
    updated_at = now()
FROM d
WHERE x.id = d.id`

// requeueForIssuance marks the given certificates due now and requeues their
// domains as first issuances, with the reason in ssl_error. Locked rows are passed
// over: the next pass (requeueDue) picks them up.
func (q *Queue) requeueForIssuance(ctx context.Context, ids, reasons []string) (int64, error) {
	tag, err := q.db.Exec(ctx, requeueForIssuanceSQL, ids, reasons)
	if err != nil {
		return 0, fmt.Errorf("mark unusable certificates due for issuance: %w", err)
	}
	return tag.RowsAffected(), nil
}

// judge returns a stored chain's leaf, or why it cannot serve its domain.
func judge(chain, domain string) (*x509.Certificate, string) {
	leaf, err := issuing.LeafFromPEM(chain)
	if err != nil {
		return nil, fmt.Sprintf("stored certificate cannot be read (%v); ordering a new one", err)
	}
	if err := leaf.VerifyHostname(domain); err != nil {
		names := leaf.DNSNames
		if len(names) == 0 {
			names = []string{leaf.Subject.CommonName}
		}
		return nil, fmt.Sprintf("stored certificate is for %s, not %s; ordering a new one",
			strings.Join(names, ", "), domain)
	}
	return leaf, ""
}
