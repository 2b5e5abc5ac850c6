package queue

import (
	"context"
	"fmt"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

// Counts is the number of acme domains in each ssl_status.
type Counts struct {
	Pending      int `json:"pending"`
	Provisioning int `json:"provisioning"`
	Active       int `json:"active"`
	Failed       int `json:"failed"`
}

// Trouble is a domain that is retrying or has failed.
type Trouble struct {
	ID          string     `json:"domain_id"`
	Domain      string     `json:"domain"`
	SSLStatus   string     `json:"ssl_status"`
	SSLAttempts int        `json:"ssl_attempts"`
	SSLError    *string    `json:"ssl_error"`
	LastAttempt *time.Time `json:"last_attempt_at"`
	// NextAttempt is nil for a domain no pass will retry (failed, at the limit).
	NextAttempt *time.Time `json:"next_attempt_at"`
	// PausedUntil and PauseReason say what pause holds the domain back, if any.
	PausedUntil *time.Time `json:"paused_until"`
	PauseReason *string    `json:"pause_reason"`
	// Profile is the domain's own ACME profile (nil: --acme-profile);
	// CertificateProfile its certificate's (nil: not recorded).
	Profile            *string `json:"ssl_profile"`
	CertificateProfile *string `json:"certificate_profile"`
}

// ProfileCount is how many acme domains name a profile, and how many were refused.
type ProfileCount struct {
	Profile string `json:"profile"`
	Domains int    `json:"domains"`
	Refused int    `json:"refused"`
}

// Overview is what `certworker status` prints.
type Overview struct {
	Counts  Counts    `json:"counts"`
	Domains []Trouble `json:"domains"`
	// Pauses are the pauses in force, the CA's included.
	Pauses []issuing.PauseState `json:"pauses"`
	// Profiles are the profiles domains name of their own, most used first.
	Profiles []ProfileCount `json:"profiles"`
	// Replace is the progress of replacing certificates whose window has started.
	Replace issuing.ReplaceProgress `json:"replace"`
	// Issuers count the stored certificates of acme domains by issuing CA, most first.
	Issuers []IssuerCount `json:"issuers"`
}

// IssuerCount is how many stored certificates of acme domains a CA issued.
type IssuerCount struct {
	// Directory is the CA's ACME directory, "" when none is recorded.
	Directory    string `json:"directory"`
	Certificates int    `json:"certificates"`
}

// pauseSQL is a LATERAL join giving row d, as pz, the pause covering it that ends
// last, matched as the claim matches.
const pauseSQL = `
LEFT JOIN LATERAL (
    SELECT p.scope, p.paused_until, p.reason FROM certworker_pauses p
    WHERE p.paused_until > now()
      AND (p.scope = 'ca'
           OR (p.scope = '` + issuing.ScopeTenant + `' AND p.key = d.tenant_id::text)
           OR (p.scope IN ('registered_domain', 'domain') AND p.key = ANY (certworker_suffixes(d.domain))
               AND (p.scope = 'registered_domain' OR p.key = lower(d.domain))))
    ORDER BY p.paused_until DESC LIMIT 1) pz ON true`

// curve is the backoff curve the workers recorded, or this Queue's.
func (q *Queue) curve(ctx context.Context) (issuing.Config, error) {
	s, ok, err := q.Settings(ctx)
	if err != nil || !ok {
		return q.cfg, err
	}
	c := q.cfg
	c.RetryBase, c.RetryMax, c.MaxAttempts = s.RetryBase, s.RetryMax, s.MaxAttempts
	return c, nil
}

// troubleColumnsSQL are the columns Overview reads, named rather than *: `status`
// runs under the workers' role (deploy/grants.sql). id keeps UNION's rows apart.
const troubleColumnsSQL = `id, tenant_id, domain, verification_status, ssl_provider, ssl_status, ssl_attempts, ssl_error,
        ssl_last_attempt_at, ssl_profile`

var countsSQL = `SELECT ssl_status, count(*) FROM proxy_domains
WHERE ssl_provider = 'acme' AND ($1::uuid IS NULL OR tenant_id = $1::uuid) GROUP BY 1`

// counts is the number of acme domains in each ssl_status, of one tenant (nil: all).
func (q *Queue) counts(ctx context.Context, tenant *string) (Counts, error) {
	var c Counts
	rows, err := q.db.Query(ctx, countsSQL, tenant)
	if err != nil {
		return c, fmt.Errorf("count domains: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			return c, fmt.Errorf("count domains: %w", err)
		}
		switch s {
		case "pending":
			c.Pending = n
		case "provisioning":
			c.Provisioning = n
		case "active":
			c.Active = n
		case "failed":
			c.Failed = n
		}
	}
	if err := rows.Err(); err != nil {
		return c, fmt.Errorf("count domains: %w", err)
	}
	return c, nil
}

var overviewSQL = `
SELECT d.id::text, d.domain, d.ssl_status, d.ssl_attempts, d.ssl_error, d.ssl_last_attempt_at,
    ` + nextAttemptAtSQL("$1", "$2", "$3") + `, pz.paused_until, pz.reason,
    d.ssl_profile, (SELECT c.profile FROM proxy_certificates c WHERE c.domain = d.domain)
FROM (
    SELECT ` + troubleColumnsSQL + ` FROM proxy_domains
    WHERE ssl_provider = 'acme'
      AND (ssl_status = 'failed' OR (ssl_status = 'pending' AND (ssl_attempts <> 0 OR ssl_error IS NOT NULL)))
    UNION
    SELECT ` + troubleColumnsSQL + ` FROM proxy_domains x
    WHERE ` + claimableSQL + `
      AND EXISTS (SELECT 1 FROM certworker_pauses WHERE scope <> 'ca' AND paused_until > now())
      AND EXISTS (SELECT 1 FROM certworker_pauses p
                  WHERE p.paused_until > now()
                    AND ((p.scope IN ('registered_domain', 'domain')
                          AND p.key = ANY (certworker_suffixes(x.domain))
                          AND (p.scope = 'registered_domain' OR p.key = lower(x.domain)))
                         OR (p.scope = '` + issuing.ScopeTenant + `' AND p.key = x.tenant_id::text)))
    UNION
    SELECT ` + troubleColumnsSQL + ` FROM proxy_domains
    WHERE ssl_profile_refused IS NOT NULL AND ssl_profile = ssl_profile_refused
      AND ssl_provider = 'acme' AND ssl_status = 'active'
) d ` + pauseSQL + `
WHERE $4::uuid IS NULL OR d.tenant_id = $4::uuid
ORDER BY d.ssl_last_attempt_at DESC NULLS LAST, d.domain
LIMIT $5`

// Overview counts acme domains by state and lists every domain retrying, failed,
// held back by a pause of its name or registered domain, or renewed under its
// certificate's profile, with its next attempt; the pauses; and the profiles.
func (q *Queue) Overview(ctx context.Context) (*Overview, error) {
	return q.OverviewOf(ctx, "", 0)
}

// OverviewOf is Overview with the counts and the domains of one tenant only (tenant
// "": of every tenant), and at most limit domains listed (0: all). The pauses,
// profiles, replacement and issuers are the fleet's.
func (q *Queue) OverviewOf(ctx context.Context, tenant string, limit int) (*Overview, error) {
	var tenantArg *string
	if tenant != "" {
		tenantArg = &tenant
	}
	var limitArg *int
	if limit > 0 {
		limitArg = &limit
	}
	counts, err := q.counts(ctx, tenantArg)
	if err != nil {
		return nil, err
	}
	cfg, err := q.curve(ctx)
	if err != nil {
		return nil, err
	}
	o := &Overview{Counts: counts, Domains: []Trouble{}}
	// The rows to list are found first by their own indexes; only they are matched
	// with the pauses.
	rows, err := q.db.Query(ctx, overviewSQL,
		cfg.MaxAttempts, seconds(cfg.RetryBase), seconds(cfg.RetryMax), tenantArg, limitArg)
	if err != nil {
		return nil, fmt.Errorf("list failing domains: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var t Trouble
		if err := rows.Scan(&t.ID, &t.Domain, &t.SSLStatus, &t.SSLAttempts, &t.SSLError,
			&t.LastAttempt, &t.NextAttempt, &t.PausedUntil, &t.PauseReason,
			&t.Profile, &t.CertificateProfile); err != nil {
			return nil, fmt.Errorf("list failing domains: %w", err)
		}
		o.Domains = append(o.Domains, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list failing domains: %w", err)
	}
	if o.Pauses, err = q.Pauses(ctx); err != nil {
		return nil, err
	}
	if o.Profiles, err = q.profileCounts(ctx); err != nil {
		return nil, err
	}
	if o.Replace, err = q.ReplaceProgress(ctx, ""); err != nil {
		return nil, err
	}
	if o.Issuers, err = q.issuerCounts(ctx); err != nil {
		return nil, err
	}
	return o, nil
}

var issuerCountsSQL = `
SELECT COALESCE(c.issuer_directory, ''), count(*)
FROM proxy_certificates c JOIN proxy_domains d ON d.domain = c.domain AND d.ssl_provider = 'acme'
GROUP BY 1 ORDER BY 2 DESC, 1`

func (q *Queue) issuerCounts(ctx context.Context) ([]IssuerCount, error) {
	rows, err := q.db.Query(ctx, issuerCountsSQL)
	if err != nil {
		return nil, fmt.Errorf("count certificates by CA: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (IssuerCount, error) {
		var c IssuerCount
		err := r.Scan(&c.Directory, &c.Certificates)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("count certificates by CA: %w", err)
	}
	return append([]IssuerCount{}, out...), nil
}

var profileCountsSQL = `
SELECT ssl_profile, count(*), count(*) FILTER (WHERE ssl_profile = ssl_profile_refused)
FROM proxy_domains WHERE ssl_profile IS NOT NULL AND ssl_provider = 'acme'
GROUP BY 1 ORDER BY 2 DESC, 1`

// profileCounts counts the acme domains naming each profile, by its partial index.
func (q *Queue) profileCounts(ctx context.Context) ([]ProfileCount, error) {
	rows, err := q.db.Query(ctx, profileCountsSQL)
	if err != nil {
		return nil, fmt.Errorf("count profiles: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ProfileCount, error) {
		var p ProfileCount
		err := r.Scan(&p.Profile, &p.Domains, &p.Refused)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("count profiles: %w", err)
	}
	return append([]ProfileCount{}, out...), nil
}

var listPausesSQL = `
SELECT scope, key, source, paused_until, reason, directory FROM certworker_pauses
WHERE paused_until > now() ORDER BY paused_until DESC`

// Pauses are the pauses in force, the one that ends last first.
func (q *Queue) Pauses(ctx context.Context) ([]issuing.PauseState, error) {
	rows, err := q.db.Query(ctx, listPausesSQL)
	if err != nil {
		return nil, fmt.Errorf("list pauses: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (issuing.PauseState, error) {
		var p issuing.PauseState
		err := r.Scan(&p.Scope, &p.Key, &p.Source, &p.PausedUntil, &p.Reason, &p.Directory)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("list pauses: %w", err)
	}
	return append([]issuing.PauseState{}, out...), nil
}

// StoredCertificate is a proxy_certificates row, without its key.
type StoredCertificate struct {
	Issuer    *string    `json:"issuer"`
	Serial    *string    `json:"serial"`
	NotBefore *time.Time `json:"not_before"`
	// NotAfter is expires_at, or the leaf's own when NULL; zero when neither is known.
	NotAfter  time.Time  `json:"not_after,omitzero"`
	RenewAt   *time.Time `json:"renew_at"`
	AutoRenew bool       `json:"auto_renew"`
	// Profile is its ACME profile, nil when none is recorded (matches any).
	Profile *string `json:"profile"`
	// Directory is the ACME directory of the issuing CA, nil when none is recorded.
	Directory *string `json:"issuer_directory"`
}

// DomainState is everything `certworker status DOMAIN` shows.
type DomainState struct {
	ID                 string     `json:"domain_id"`
	TenantID           string     `json:"tenant_id"`
	Domain             string     `json:"domain"`
	VerificationStatus string     `json:"verification_status"`
	SSLStatus          string     `json:"ssl_status"`
	SSLProvider        string     `json:"ssl_provider"`
	SSLAttempts        int        `json:"ssl_attempts"`
	SSLError           *string    `json:"ssl_error"`
	LastAttempt        *time.Time `json:"last_attempt_at"`
	NextAttempt        *time.Time `json:"next_attempt_at"`
	ExpiresAt          *time.Time `json:"ssl_expires_at"`
	PausedUntil        *time.Time `json:"paused_until"`
	PauseReason        *string    `json:"pause_reason"`
	ClaimedBy          *string    `json:"claimed_by"`
	LeaseExpiresAt     *time.Time `json:"lease_expires_at"`
	// Profile is the domain's own ACME profile (nil: --acme-profile); ProfileRefused
	// the one the CA does not offer.
	Profile        *string            `json:"ssl_profile"`
	ProfileRefused *string            `json:"ssl_profile_refused"`
	Certificate    *StoredCertificate `json:"certificate"`
	// CADirectory is the CA its last claim went to, CACause why the second, CARefused a
	// CA that refused the name; nil for none.
	CADirectory *string `json:"ca_directory"`
	CACause     *string `json:"ca_cause"`
	CARefused   *string `json:"ca_refused"`
	// Challenge is its last order's ACME challenge, ChallengeReason why; nil before any.
	Challenge       *string `json:"challenge"`
	ChallengeReason *string `json:"challenge_reason"`

	// keeps: verified, acme, and no case twin keeps the name from it (pickTwin).
	keeps bool
}

var stateSQL = `
SELECT d.id::text, d.tenant_id::text, d.domain, d.verification_status, d.ssl_status, d.ssl_provider,
    d.ssl_attempts, d.ssl_error, d.ssl_last_attempt_at, ` + nextAttemptAtSQL("$2", "$3", "$4") + `,
    pz.paused_until, pz.reason,
    d.ssl_expires_at, d.ssl_claimed_by, ` + finiteSQL("d.ssl_lease_expires_at") + `, d.ssl_profile, d.ssl_profile_refused,
    c.id IS NOT NULL, c.issuer, c.serial, c.not_before, c.expires_at,
    CASE WHEN c.expires_at IS NULL THEN c.certificate_pem END, c.renew_at, COALESCE(c.auto_renew, false),
    c.profile, c.issuer_directory, d.ssl_ca_directory, d.ssl_ca_cause, d.ssl_ca_refused,
    ` + twinCountsSQL("d") + ` AND ` + keepsNameSQL("d") + `,
    ds.challenge, ds.challenge_reason
FROM proxy_domains d LEFT JOIN proxy_certificates c ON c.domain = d.domain
LEFT JOIN certworker_dns_state ds ON ds.domain_id = d.id ` + pauseSQL + `
WHERE lower(d.domain) = lower($1)
ORDER BY d.domain`

// State is one domain's whole state and its certificate, by name in any case:
// ErrNotFound for an unknown name, an *AmbiguousError for twins pickTwin cannot tell.
func (q *Queue) State(ctx context.Context, domain string) (*DomainState, error) {
	cfg, err := q.curve(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := q.db.Query(ctx, stateSQL, domain,
		cfg.MaxAttempts, seconds(cfg.RetryBase), seconds(cfg.RetryMax))
	if err != nil {
		return nil, fmt.Errorf("read domain: %w", err)
	}
	states, err := pgx.CollectRows(rows, scanState)
	if err != nil {
		return nil, fmt.Errorf("read domain: %w", err)
	}
	if len(states) == 0 {
		return nil, issuing.ErrNotFound
	}
	i, err := pickTwin(domain, len(states), func(i int) (string, string, bool) {
		return states[i].ID, states[i].Domain, states[i].keeps
	})
	if err != nil {
		return nil, err
	}
	return states[i], nil
}

func scanState(row pgx.CollectableRow) (*DomainState, error) {
	var s DomainState
	var c StoredCertificate
	var hasCert bool
	var notAfter *time.Time
	var chain *string
	err := row.Scan(
		&s.ID, &s.TenantID, &s.Domain, &s.VerificationStatus, &s.SSLStatus, &s.SSLProvider,
		&s.SSLAttempts, &s.SSLError, &s.LastAttempt, &s.NextAttempt, &s.PausedUntil, &s.PauseReason,
		&s.ExpiresAt, &s.ClaimedBy, &s.LeaseExpiresAt, &s.Profile, &s.ProfileRefused,
		&hasCert, &c.Issuer, &c.Serial, &c.NotBefore, &notAfter, &chain, &c.RenewAt, &c.AutoRenew,
		&c.Profile, &c.Directory, &s.CADirectory, &s.CACause, &s.CARefused, &s.keeps,
		&s.Challenge, &s.ChallengeReason)
	if err != nil {
		return nil, err
	}
	if !hasCert {
		return &s, nil
	}
	switch {
	case notAfter != nil:
		c.NotAfter = *notAfter
	case chain != nil:
		if leaf, err := issuing.LeafFromPEM(*chain); err == nil {
			c.NotAfter = leaf.NotAfter
		}
	}
	s.Certificate = &c
	return &s, nil
}
