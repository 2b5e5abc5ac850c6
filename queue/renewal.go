package queue

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"
)

// RenewAtFromValidity is the renewal time of a certificate whose CA gives no ACME
// Renewal Information: when a third of its lifetime remains. A 90-day certificate
// renews after 60 days, a 6-day one after 4. The reference's fixed "30 days before
// expiry" renewed any certificate shorter than 30 days on every poll.
func RenewAtFromValidity(notBefore, notAfter time.Time) time.Time {
	return notAfter.Add(-notAfter.Sub(notBefore) / 3)
}

// legacyRenewWithin is used only for a certificate row whose PEM cannot be parsed,
// so its lifetime is unknown: the reference's rule.
const legacyRenewWithin = 30 * 24 * time.Hour

// MarkRenewals moves active domains whose certificate is due for renewal back to
// 'pending' (which wakes every instance through the trigger), and returns how many.
// Driven off proxy_certificates.renew_at, so a certificate replaced out of band is
// renewed on its own schedule. Rows with no renewal time are first given one from
// their own certificate_pem (fillRenewalTimes).
//
// A domain keeps its current certificate until the new one is stored, and the
// renewal time only moves when a new certificate is stored, so a certificate is never
// renewed again before its new renewal time.
func (q *Queue) MarkRenewals(ctx context.Context) (int64, error) {
	if err := q.fillRenewalTimes(ctx); err != nil {
		return 0, err
	}
	tag, err := q.db.Exec(ctx, `
UPDATE proxy_domains d SET ssl_status = 'pending', ssl_attempts = 0, updated_at = now()
WHERE d.ssl_status = 'active'
  AND d.ssl_provider = 'acme'
  AND d.verification_status = 'verified'
  AND EXISTS (
      SELECT 1 FROM proxy_certificates c
      WHERE c.domain = d.domain AND c.auto_renew AND c.renew_at <= now())`)
	if err != nil {
		return 0, fmt.Errorf("mark renewals: %w", err)
	}
	return tag.RowsAffected(), nil
}

// fillRenewalTimes gives a renewal time to certificate rows that have none (uploaded
// by hand, or written before this column existed), by the same third-of-lifetime rule,
// from the validity period in their own certificate_pem.
func (q *Queue) fillRenewalTimes(ctx context.Context) error {
	rows, err := q.db.Query(ctx, `
SELECT id::text, certificate_pem, expires_at FROM proxy_certificates
WHERE renew_at IS NULL AND auto_renew LIMIT 1000`)
	if err != nil {
		return fmt.Errorf("read certificates without a renewal time: %w", err)
	}
	type fill struct {
		id      string
		renewAt time.Time
	}
	var fills []fill
	for rows.Next() {
		var id, chain string
		var expires time.Time
		if err := rows.Scan(&id, &chain, &expires); err != nil {
			rows.Close()
			return fmt.Errorf("read certificates without a renewal time: %w", err)
		}
		renewAt, err := renewAtFromPEM(chain)
		if err != nil {
			renewAt = expires.Add(-legacyRenewWithin)
		}
		fills = append(fills, fill{id, renewAt})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read certificates without a renewal time: %w", err)
	}
	for _, f := range fills {
		if _, err := q.db.Exec(ctx, `UPDATE proxy_certificates SET renew_at = $2 WHERE id = $1 AND renew_at IS NULL`,
			f.id, f.renewAt); err != nil {
			return fmt.Errorf("record renewal time: %w", err)
		}
	}
	return nil
}

// renewAtFromPEM applies RenewAtFromValidity to the first certificate (the leaf) of a
// PEM chain.
func renewAtFromPEM(chain string) (time.Time, error) {
	leaf, err := LeafFromPEM(chain)
	if err != nil {
		return time.Time{}, err
	}
	return RenewAtFromValidity(leaf.NotBefore, leaf.NotAfter), nil
}

// LeafFromPEM parses the first certificate of a PEM chain.
func LeafFromPEM(chain string) (*x509.Certificate, error) {
	rest := []byte(chain)
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, errors.New("no certificate in PEM")
		}
		if block.Type == "CERTIFICATE" {
			return x509.ParseCertificate(block.Bytes)
		}
	}
}
