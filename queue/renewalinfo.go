package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

// The renewal-information reads (RFC 9773) of stored certificates. Each instance asks
// the CA about the certificates whose ari_next_at has passed; instances share the work
// by claiming each read (ClaimRenewalInfo moves ari_next_at forward before anyone asks)
// and share the CA's budget through TakeRenewalInfoTokens. Every time written is on the
// database's clock: the worker hands over delays, and the statements add them to now().

const (
	// RenewalInfoHold is how far a claimed read moves ari_next_at: the time one
	// instance has to ask the CA and record the answer before another may ask again.
	// Far longer than a read takes (a token, then one request bounded by seconds);
	// an instance that dies mid-read costs its certificates this much delay, which
	// is nothing next to the CA's six hours between reads.
	RenewalInfoHold = 10 * time.Minute
	// renewalInfoIneligibleIn is when a certificate due for a read, but not to be
	// asked about now (its domain's renewal is under way, it failed, it is not
	// verified), is looked at again. Its next read is then due when the domain is
	// active again, at worst this late.
	renewalInfoIneligibleIn = issuing.RenewalInfoDefault
	// renewalInfoSweep is how many due rows that are not to be asked about one claim
	// moves out of the way besides the reads it claims. Without it they would stay due
	// and keep the earliest ari_next_at in the past, and an instance would wake for
	// them at once, again and again. The claim locks that many rows more than it
	// takes (each lock a write of the row's header), so it is small: a backlog of
	// them (a mass failure) is cleared by claims that follow each other at once.
	renewalInfoSweep = 32
)

// RenewalInfoCandidate is a stored certificate whose renewal information an instance
// has claimed the read of.
type RenewalInfoCandidate struct {
	// ID is the certificate row's id, DomainID and TenantID its domain's.
	ID, DomainID, TenantID, Domain string
	ChainPEM                       string
	NotBefore                      time.Time
	NotAfter                       time.Time
	RenewAt                        time.Time
	// Now is the database's time at the claim: the worker judges the CA's window by
	// it, not by its own clock.
	Now time.Time
	// Directory is the directory of the CA that issued the certificate
	// (issuer_directory), or "" when not recorded: the one to ask.
	Directory string

	// serial and version are the certificate's when the read was claimed:
	// RecordRenewalInfo writes only while both still match.
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

// ClaimRenewalInfo claims the reads of up to n certificates whose renewal information
// is due (ari_next_at passed), still valid, of verified active ACME domains that
// renew automatically, the longest waiting first: it moves their ari_next_at
// RenewalInfoHold ahead, in one statement with FOR UPDATE SKIP LOCKED, so that
// instances claiming together take different rows, and none asks the CA about a
// certificate another is asking about.
//
// In the same statement it moves due rows that are not to be asked about out of the
// way (up to renewalInfoSweep): an expired certificate, one that no longer renews
// automatically or whose domain is gone is never asked about again (ari_next_at
// NULL, as RFC 9773 §4.3 advises); one whose domain is not active now (a renewal
// under way, a failure) is looked at again in renewalInfoIneligibleIn. It returns the
// claimed reads and how many rows it moved out of the way.
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
		// An eligible row has all of them: a domain, an expiry in the future, a
		// renewal time, and the chain.
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

// NextRenewalInfo is how long until the next renewal-information read falls due, on
// the database's clock (0: one is due now); ok is false when none is scheduled. One
// read of the index on ari_next_at.
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

// RecordRenewalInfo records what the CA said of the claimed certificate c's renewal
// window, and returns how long until the row's renewal time, on the database's clock.
// A renewal time that moved earlier also moves the domain's urgency (ssl_renew_by),
// so that a certificate the CA is about to revoke is renewed before first issuances;
// the domain's row is written only then.
//
// Written only while the row holds the certificate that was asked about: the same
// serial and the same version (the trigger of migration 00007 draws a new version
// whenever the certificate, its key or its domain changes, including an upload that
// keeps a stale serial). A certificate replaced meanwhile keeps its own schedule, and
// the call returns ErrCertificateReplaced.
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
