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
	// NextAttempt is nil for a domain that waits for a retry (failed, or at the
	// attempt limit).
	NextAttempt *time.Time `json:"next_attempt_at"`
	// PausedUntil and PauseReason say what holds the domain back, if a pause does
	// (a CA's rate limit, the ledger, a CA that cannot be reached).
	PausedUntil *time.Time `json:"paused_until"`
	PauseReason *string    `json:"pause_reason"`
	// Profile is the domain's own ACME profile, nil for --acme-profile;
	// CertificateProfile the one its stored certificate was issued under, nil when
	// none is recorded.
	Profile            *string `json:"ssl_profile"`
	CertificateProfile *string `json:"certificate_profile"`
}

// ProfileCount is how many acme domains name a profile of their own, and how many of
// them the CA refused (ssl_profile_refused).
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
	// Profiles are the profiles domains name of their own (ssl_profile), most used
	// first; every other acme domain orders under --acme-profile.
	Profiles []ProfileCount `json:"profiles"`
	// Replace is how the replacement of the certificates whose renewal window has
	// started is going, at the pace of every CA the fleet has an account with.
	Replace issuing.ReplaceProgress `json:"replace"`
	// Issuers count the stored certificates of acme domains by the CA that issued them
	// (proxy_certificates.issuer_directory: with a second CA, two), most first.
	Issuers []IssuerCount `json:"issuers"`
}

// IssuerCount is how many stored certificates of acme domains a CA issued.
type IssuerCount struct {
	// Directory is the CA's ACME directory, "" for certificates with none recorded
	// (stored before migration 00017, or uploaded).
	Directory    string `json:"directory"`
	Certificates int    `json:"certificates"`
}

// pauseSQL is a LATERAL join giving the row d (of proxy_domains, aliased d) the pause
// in force that covers it and ends last, as pz: of the CA (any directory: status
// does not know the worker's), of its registered domain, or of its name. The same
// matching as the claim's.
const pauseSQL = `
LEFT JOIN LATERAL (
    SELECT p.scope, p.paused_until, p.reason FROM certworker_pauses p
    WHERE p.paused_until > now()
      AND (p.scope = 'ca'
           OR (p.scope = '` + issuing.ScopeTenant + `' AND p.key = d.tenant_id::text)
           OR (p.scope IN ('registered_domain', 'domain') AND p.key = ANY (certworker_suffixes(d.domain))
               AND (p.scope = 'registered_domain' OR p.key = lower(d.domain))))
    ORDER BY p.paused_until DESC LIMIT 1) pz ON true`

// curve is the backoff curve `status` reports by: the one the running workers
// recorded (certworker_settings), or this Queue's where none has.
func (q *Queue) curve(ctx context.Context) (issuing.Config, error) {
	s, ok, err := q.Settings(ctx)
	if err != nil || !ok {
		return q.cfg, err
	}
	c := q.cfg
	c.RetryBase, c.RetryMax, c.MaxAttempts = s.RetryBase, s.RetryMax, s.MaxAttempts
	return c, nil
}

// troubleColumnsSQL are the columns of proxy_domains that Overview reads of a row it
// lists, named rather than *: the workers' role may read only the columns certworker
// uses (deploy/grants.sql), and `status` works under it. id makes UNION keep two rows
// apart, as whole rows did.
const troubleColumnsSQL = `id, tenant_id, domain, verification_status, ssl_provider, ssl_status, ssl_attempts, ssl_error,
        ssl_last_attempt_at, ssl_profile`

var countsSQL = `SELECT ssl_status, count(*) FROM proxy_domains
WHERE ssl_provider = 'acme' AND ($1::uuid IS NULL OR tenant_id = $1::uuid) GROUP BY 1`

// counts is the number of acme domains in each ssl_status, of one tenant (nil: of
// every tenant).
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

// Overview counts acme domains by state and lists every domain that is retrying
// (pending with a failure behind it), failed, held back by a pause of its name or
// registered domain, or active under its certificate's profile because the CA does not
// offer its own, most recent attempt first, with when each is next tried under the
// fleet's settings; the pauses in force; and the profiles domains name.
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
	// The rows to list are found first, each way by its own index (failed and
	// retrying rows; due rows under a pause of their name or registered domain, looked
	// for only while such a pause exists), and only they are matched with the pauses:
	// matching every row of a million would take seconds.
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

// issuerCounts counts the certificates of acme domains by the CA that issued them.
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

// profileCounts counts the acme domains naming each profile of their own, through
// migration 00014's partial index (domains on --acme-profile are not read).
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
	// NotAfter is expires_at, or the leaf's own when expires_at is NULL (the
	// reference's rows); zero when neither is known.
	NotAfter  time.Time  `json:"not_after,omitzero"`
	RenewAt   *time.Time `json:"renew_at"`
	AutoRenew bool       `json:"auto_renew"`
	// Profile is the ACME profile it was issued under, nil when none is recorded
	// (issued before migration 00014, or uploaded): it matches any.
	Profile *string `json:"profile"`
	// Directory is the ACME directory of the CA that issued it, nil when none is
	// recorded (stored before migration 00017, or uploaded).
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
	// Profile is the domain's own ACME profile, nil for --acme-profile;
	// ProfileRefused the one the CA does not offer, which the worker stopped trying.
	Profile        *string            `json:"ssl_profile"`
	ProfileRefused *string            `json:"ssl_profile_refused"`
	Certificate    *StoredCertificate `json:"certificate"`
	// CADirectory is the CA its last claim went to (a second CA's claim records it),
	// CACause why that was the second, CARefused a CA that refused the name or that
	// its CAA records forbid (a second CA's rules, queue/fallback.go); nil for none.
	CADirectory *string `json:"ca_directory"`
	CACause     *string `json:"ca_cause"`
	CARefused   *string `json:"ca_refused"`
	// Challenge is the ACME challenge its last order used or was to use (http-01 or
	// dns-01), ChallengeReason why (what the DNS said of its _acme-challenge CNAME);
	// nil before any order with a preflight.
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

// State is one domain's whole state and its certificate, by name in any case. It
// returns ErrNotFound for an unknown name, and an *AmbiguousError naming them all when
// rows that differ only in case match it and pickTwin cannot tell which is meant:
// showing one of them would answer for the wrong one.
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
