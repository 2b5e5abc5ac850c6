package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

// The renewal-information reads (RFC 9773) of stored certificates. Instances share
// the work by claiming each read and the CA's budget through TakeRenewalInfoTokens.

const (
	// RenewalInfoHold is how far a claimed read moves ari_next_at: far longer than a
	// read takes.
	RenewalInfoHold = 10 * time.Minute
	// renewalInfoIneligibleIn is when a due certificate not to be asked about now (its
	// domain renewing, failed, unverified) is looked at again.
	renewalInfoIneligibleIn = issuing.RenewalInfoDefault
	// renewalInfoSweep is how many due rows not to be asked about one claim moves out
	// of the way, so they do not keep a read due now.
	renewalInfoSweep = 32
)

// RenewalInfoCandidate is a certificate whose renewal-information read was claimed.
type RenewalInfoCandidate struct {
	// ID is the certificate row's id, DomainID and TenantID its domain's.
	ID, DomainID, TenantID, Domain string
	ChainPEM                       string
	NotBefore                      time.Time
	NotAfter                       time.Time
	RenewAt                        time.Time
	// Now is the database's time at the claim, by which the CA's window is judged.
	Now time.Time
	// Directory is the issuing CA's directory (issuer_directory), or "".
	Directory string

	// serial and version are the certificate's at the claim; RecordRenewalInfo writes
	// only while both match.
	serial  *string
	version *int64
}

var claimRenewalInfoSQL = `
WITH scanned AS (
    SELECT c.id, c.ari_next_at, d.id AS domain_id, d.tenant_id,
           COALESCE(c.expires_at > now() AND c.renew_at IS NOT NULL AND c.auto_renew
                    AND d.ssl_status = 'active' AND d.ssl_provider = 'acme'
                    AND d.verification_status = 'verified', false) AS eligible,
           (d.id IS NULL OR c.expires_at IS NULL OR c.expires_at <= now() OR NOT c.auto_renew) AS finished
    FROM proxy_certificates c LEFT JOIN proxy_domains d ON d.domain = c.domain
    WHERE c.ari_next_at <= now()
    ORDER BY c.ari_next_at
    LIMIT $2
    FOR UPDATE OF c SKIP LOCKED
), ranked AS (
    SELECT id, domain_id, tenant_id, eligible, finished, row_number() OVER (PARTITION BY eligible ORDER BY ari_next_at) AS rank
    FROM scanned
)
UPDATE proxy_certificates c SET ari_next_at = CASE
        WHEN r.eligible THEN now() + make_interval(secs => $3)
        WHEN r.finished THEN NULL
        ELSE now() + make_interval(secs => $4) END
FROM ranked r
WHERE c.id = r.id AND (NOT r.eligible OR r.rank <= $1)
RETURNING r.eligible, c.id::text, r.domain_id::text, r.tenant_id::text, c.domain, CASE WHEN r.eligible THEN c.certificate_pem END,
          COALESCE(c.not_before, c.expires_at), c.expires_at, c.renew_at, now(), c.serial, c.version,
          COALESCE(c.issuer_directory, '')`

// ClaimRenewalInfo claims the reads of up to n due certificates of verified active
// ACME domains that renew automatically, longest waiting first, by moving ari_next_at
// RenewalInfoHold ahead (SKIP LOCKED). It also moves up to renewalInfoSweep due rows
// not to be asked about out of the way: for good (RFC 9773 §4.3) when expired, not
// auto-renewed or without a domain, else for renewalInfoIneligibleIn.
func (q *Queue) ClaimRenewalInfo(ctx context.Context, n int) ([]RenewalInfoCandidate, int, error) {
	if n <= 0 {
		return nil, 0, nil
	}
	rows, err := q.db.Query(ctx, claimRenewalInfoSQL,
		n, n+renewalInfoSweep, seconds(RenewalInfoHold), seconds(renewalInfoIneligibleIn))
	if err != nil {
		return nil, 0, fmt.Errorf("claim renewal-information reads: %w", err)
	}
	defer rows.Close()
	var out []RenewalInfoCandidate
	swept := 0
	for rows.Next() {
		var (
			eligible                   bool
			c                          RenewalInfoCandidate
			domainID, tenantID, chain  *string
			notBefore, notAfter, renew *time.Time
		)
		if err := rows.Scan(&eligible, &c.ID, &domainID, &tenantID, &c.Domain, &chain, &notBefore, &notAfter, &renew, &c.Now,
			&c.serial, &c.version, &c.Directory); err != nil {
			return nil, 0, fmt.Errorf("claim renewal-information reads: %w", err)
		}
		if !eligible {
			swept++
			continue
		}
		// An eligible row has all of them.
		c.DomainID, c.TenantID, c.ChainPEM, c.NotBefore, c.NotAfter, c.RenewAt = *domainID, *tenantID, *chain, *notBefore, *notAfter, *renew
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("claim renewal-information reads: %w", err)
	}
	return out, swept, nil
}

var nextRenewalInfoSQL = `
SELECT ` + secondsUntilSQL(`(SELECT min(ari_next_at) FROM proxy_certificates WHERE ari_next_at IS NOT NULL)`)

// NextRenewalInfo is how long until the next renewal-information read falls due (0:
// now); ok is false when none is scheduled.
func (q *Queue) NextRenewalInfo(ctx context.Context) (d time.Duration, ok bool, err error) {
	var secs *float64
	if err := q.db.QueryRow(ctx, nextRenewalInfoSQL).
		Scan(&secs); err != nil {
		return 0, false, fmt.Errorf("next renewal-information read: %w", err)
	}
	if secs == nil {
		return 0, false, nil
	}
	return durationFromSeconds(*secs), true, nil
}

var recordRenewalInfoSQL = `
WITH c AS (
    UPDATE proxy_certificates SET
        renew_at = CASE WHEN $7 THEN LEAST(renew_at, now()) ELSE LEAST(renew_at, $2) END,
        ari_window_start = CASE WHEN $3::timestamptz IS NULL THEN ari_window_start ELSE $8 END,
        ari_window_end = COALESCE($3, ari_window_end),
        ari_next_at = now() + make_interval(secs => $4)
    WHERE id = $1 AND serial IS NOT DISTINCT FROM $5 AND version IS NOT DISTINCT FROM $6
    RETURNING domain, renew_at, ari_window_end
), d AS (
    UPDATE proxy_domains d SET ssl_renew_by = c.ari_window_end
    FROM c
    WHERE d.domain = c.domain AND c.ari_window_end IS NOT NULL
      AND (d.ssl_renew_by IS NULL OR c.ari_window_end < d.ssl_renew_by)
)
SELECT ` + secondsUntilSQL("renew_at") + ` FROM c`

// RecordRenewalInfo records the CA's window for c and returns how long until its
// renewal time; an earlier renewal time also moves ssl_renew_by. Written only while
// the row holds the same serial and version, else ErrCertificateReplaced.
func (q *Queue) RecordRenewalInfo(ctx context.Context, c RenewalInfoCandidate, info issuing.RenewalInfo) (time.Duration, error) {
	var renewIn float64
	err := q.db.QueryRow(ctx, recordRenewalInfoSQL,
		c.ID, nullTime(info.RenewAt), nullTime(info.WindowEnd), nullSeconds(info.NextIn), c.serial, c.version, info.RenewNow,
		nullTime(info.WindowStart)).Scan(&renewIn)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, issuing.ErrCertificateReplaced
	}
	if err != nil {
		return 0, fmt.Errorf("record renewal information: %w", err)
	}
	return durationFromSeconds(renewIn), nil
}
