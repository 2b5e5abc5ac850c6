package queue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

// durationFromSeconds turns a delay computed by secondsUntilSQL into a duration (a
// time already past is 0, one too far to hold in a Duration, infinity included, the
// longest Duration).
func durationFromSeconds(s float64) time.Duration {
	switch {
	case math.IsNaN(s) || s <= 0:
		return 0
	case s >= float64(math.MaxInt64)/float64(time.Second):
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(s * float64(time.Second))
}

// MarkActive stores the certificate and turns the domain active in one statement (so
// in one transaction, and one round trip): the proxy never sees one without the
// other. The certificate row is upserted by domain; auto_renew keeps whatever the
// proxy set. It returns how long until the certificate is due for renewal.
//
// The upsert's update sets the parameters, not EXCLUDED's columns: reading
// EXCLUDED.private_key_pem needs SELECT on private_key_pem, and the workers' role
// has none (deploy/grants.sql): certworker writes private keys and never reads one
// back, so a stolen worker password does not read them either.
//
// The certificate's profile is recorded with it (cert.Profile), and the directory of
// the CA that issued it (cert.Directory, proxy_certificates.issuer_directory). A CA's
// refusal of the name (ssl_ca_refused) held for this issuance: the next, a renewal,
// asks the CAs afresh (their policy, the name's CAA records may have changed). ssl_error is NULL, or,
// while the domain's own profile is the one the CA refused (c.ProfileRefused), the
// note of that refusal: it was renewed under its certificate's, and the tenant should
// know. The note already in ssl_error is kept (it has the CA's own words, when it
// answered invalidProfile), else c.Notice. A tenant who set another profile meanwhile
// gets neither the note nor the refusal.
//
// The clock of a DNS wait (certworker_dns_state.waiting_since, which Wait keeps across
// waits that end and begin again) is forgotten: the domain is issued.
//
// A domain whose ssl_profile was set to another profile while its order ran (the
// profile trigger acts on active rows only) stores the certificate and goes back to
// pending, attempts 0, rather than active: the replacement under its own profile is
// ordered at the next pass, naming this certificate, as for a profile set on an active
// domain (profileMovedOnSQL).
//
// Nothing is written when the claim is no longer held (ErrClaimLost) or the domain is
// no longer an ACME domain (ErrNotACME; Disown drops the claim).
func (q *Queue) MarkActive(ctx context.Context, c issuing.Claim, cert *issuing.Certificate) (time.Duration, error) {
	renewAt := cert.RenewAt
	if renewAt.IsZero() {
		// An issuer that gave no renewal time must not make the certificate due at
		// once (and on every pass after).
		renewAt = issuing.RenewAtFromValidity(cert.NotBefore, cert.NotAfter)
	}
	var renewIn float64
	sql, args := markActiveStatement(c, cert, renewAt, nullString(q.errorText(ctx, c.Notice)))
	err := q.db.QueryRow(ctx, sql, args...).Scan(&renewIn)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, q.whyNotHeld(ctx, c)
	}
	if err != nil {
		return 0, fmt.Errorf("store certificate: %w", err)
	}
	return durationFromSeconds(renewIn), nil
}

var markActiveSQL = `
WITH d AS (
    UPDATE proxy_domains SET
        ssl_status = CASE WHEN ` + profileMovedOnSQL + ` THEN 'pending' ELSE 'active' END,
        ssl_last_attempt_at = CASE WHEN ` + profileMovedOnSQL + ` THEN NULL ELSE ssl_last_attempt_at END,
        ssl_expires_at = $3, ssl_attempts = 0,
        ssl_error = CASE WHEN ssl_profile = $14
                         THEN CASE WHEN ssl_error LIKE '` + issuing.ProfilePrefix + `%' THEN ssl_error ELSE $15 END END,
        ssl_profile_refused = CASE WHEN ssl_profile = $14 THEN $14 END,
        ssl_ca_refused = NULL, ssl_ca_refused_cause = NULL,
        ssl_renew_by = $10, updated_at = now(), ` + releaseClaimSQL + `
    WHERE ` + heldSQL + `
    RETURNING domain, ` + eventSQL("proxy_domains",
	"CASE WHEN EXISTS (SELECT 1 FROM proxy_certificates p WHERE p.domain = proxy_domains.domain) THEN 'renewed' ELSE 'issued' END",
	"CASE WHEN ssl_error LIKE '"+issuing.ProfilePrefix+"%' THEN 'profile_unavailable' END", "ssl_error") + ` AS event_id
), c AS (
    INSERT INTO proxy_certificates
        (domain, certificate_pem, private_key_pem, expires_at, not_before, issuer, serial, renew_at,
         ari_window_start, ari_window_end, ari_next_at, profile, issuer_directory)
    SELECT d.domain, $4, $5, $3, $6, $7, $8, $9, $16, $11, now() + make_interval(secs => $12), $13, $17 FROM d
    ON CONFLICT (domain) DO UPDATE SET
        certificate_pem = $4, private_key_pem = $5, expires_at = $3, not_before = $6,
        issuer = $7, serial = $8, renew_at = $9, ari_window_start = $16, ari_window_end = $11, ari_next_at = now() + make_interval(secs => $12),
        profile = $13, issuer_directory = $17,
        updated_at = now()
    RETURNING renew_at
), w AS (
    UPDATE certworker_dns_state SET waiting_since = NULL, updated_at = now()
    WHERE domain_id = $1 AND waiting_since IS NOT NULL AND EXISTS (SELECT 1 FROM d)
)
SELECT ` + secondsUntilSQL("renew_at") + ` FROM c`

// markActiveStatement is MarkActive's statement and its arguments: notice is what
// ssl_error says once the certificate is stored (NULL for nothing).
func markActiveStatement(c issuing.Claim, cert *issuing.Certificate, renewAt time.Time, notice *string) (string, []any) {
	return markActiveSQL, []any{
		c.ID, c.Token, cert.NotAfter, cert.ChainPEM, cert.PrivateKey, cert.NotBefore,
		cert.Issuer, cert.Serial, renewAt, issuing.RenewBy(cert.NotBefore, cert.NotAfter, cert.WindowEnd),
		nullTime(cert.WindowEnd), nullSeconds(cert.RenewalInfoIn), nullString(cert.Profile),
		nullString(c.ProfileRefused), notice, nullTime(cert.WindowStart), nullString(cert.Directory)}
}

// nullSeconds is d in seconds, or NULL for 0.
func nullSeconds(d time.Duration) *float64 {
	if d <= 0 {
		return nil
	}
	s := seconds(d)
	return &s
}

// nullString is s, or NULL for "".
func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

var whyNotHeldSQL = `
SELECT ssl_provider FROM proxy_domains WHERE id = $1 AND (ssl_claim_token = $2 OR ssl_claim_token IS NULL)`

// whyNotHeld tells a lost claim (ErrClaimLost) from a row that is no longer an ACME
// domain (ErrNotACME), still held by the claim or with its claim dropped by the
// switch, after a finishing write matched nothing.
func (q *Queue) whyNotHeld(ctx context.Context, c issuing.Claim) error {
	// The provider first: a switch away from acme drops the claim with it (the
	// trigger certworker_provider_switched), and the reason to give is the switch.
	var provider string
	err := q.db.QueryRow(ctx, whyNotHeldSQL,
		c.ID, c.Token).Scan(&provider)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return issuing.ErrClaimLost
	case err != nil:
		return fmt.Errorf("read claim: %w", err)
	case provider != "acme":
		return issuing.ErrNotACME
	}
	return issuing.ErrClaimLost
}

var disownSQL = `
UPDATE proxy_domains SET ` + releaseClaimSQL + ` WHERE id = $1 AND ssl_claim_token = $2`

// Disown drops this claim from a row that is no longer an ACME domain, leaving its
// state to whoever changed the provider. It reports whether the claim was still held.
func (q *Queue) Disown(ctx context.Context, c issuing.Claim) (bool, error) {
	tag, err := q.db.Exec(ctx, disownSQL, c.ID, c.Token)
	if err != nil {
		return false, fmt.Errorf("disown claim: %w", err)
	}
	return tag.RowsAffected() > 0, nil
}

// MarkFailed records a failure: ssl_error, one more attempt, and back to 'pending', or
// to 'failed' at the limit, which the worker does not pick up. ssl_error carries the
// reason either way: it is the only way an operator finds out why a domain is stuck.
// A negative count in a hand-edited row counts as 0.
//
// It is the worker's own failure write: the row goes back inside its
// backoff, which the worker's timer covers, so the wake trigger keeps quiet; and out
// of line (ssl_held HeldBackoff), so that no claim reads it before ReturnHeld brings
// it back.
func (q *Queue) MarkFailed(ctx context.Context, c issuing.Claim, reason string) (issuing.Failure, error) {
	var f issuing.Failure
	var status string
	var retryIn float64
	err := q.quietly(ctx, `
UPDATE proxy_domains SET
    ssl_status = CASE WHEN `+nextAttemptSQL+` >= $4 THEN 'failed' ELSE 'pending' END,
    ssl_error = $3,
    ssl_attempts = `+nextAttemptSQL+`,
    ssl_held = CASE WHEN `+nextAttemptSQL+` >= $4 THEN NULL ELSE '`+HeldBackoff+`' END,
    updated_at = now(), `+releaseClaimSQL+`
WHERE `+heldSQL+`
RETURNING ssl_attempts, ssl_status,
    `+secondsUntilSQL("ssl_last_attempt_at + make_interval(secs => "+backoffSQL("ssl_attempts", "$5", "$6")+")")+`,
    `+eventSQL("proxy_domains", "'failed'", failedReasonSQL("proxy_domains"), "ssl_error"),
		[]any{c.ID, c.Token, q.errorText(ctx, reason), q.cfg.MaxAttempts, seconds(q.cfg.RetryBase), seconds(q.cfg.RetryMax)},
		&f.Attempts, &status, &retryIn, new(int64))
	if errors.Is(err, pgx.ErrNoRows) {
		return f, q.whyNotHeld(ctx, c)
	}
	if err != nil {
		return f, fmt.Errorf("mark failed: %w", err)
	}
	f.GaveUp = status == "failed"
	if !f.GaveUp {
		f.RetryIn = durationFromSeconds(retryIn)
	}
	return f, nil
}

// quietly runs one statement that returns one row in a transaction marked as the
// worker's own (certworker.quiet), which keeps the wake trigger from notifying, and
// scans that row into dest. One round trip: BEGIN, the mark, the statement and COMMIT
// go out together.
func (q *Queue) quietly(ctx context.Context, sql string, args []any, dest ...any) error {
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(`SELECT set_config('certworker.quiet', 'on', true)`)
	b.Queue(sql, args...)
	b.Queue(`COMMIT`)
	br := q.db.SendBatch(ctx, b)
	_, err := br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		err = br.QueryRow().Scan(dest...)
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

var markPermanentSQL = `
UPDATE proxy_domains SET
    ssl_status = 'failed', ssl_error = $3,
    ssl_attempts = ` + nextAttemptSQL + `,
    updated_at = now(), ` + releaseClaimSQL + `
WHERE ` + heldSQL + `
RETURNING ` + eventSQL("proxy_domains", "'failed'", reasonSQL("proxy_domains"), "ssl_error")

// MarkPermanent fails a domain at once, whatever its attempts: a name no CA can issue
// for, a CA's refusal that no retry changes. reason is stored as
// ssl_error; the attempt is counted.
func (q *Queue) MarkPermanent(ctx context.Context, c issuing.Claim, reason string) error {
	tag, err := q.db.Exec(ctx, markPermanentSQL, c.ID, c.Token, q.errorText(ctx, reason))
	if err != nil {
		return fmt.Errorf("mark failed for good: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return q.whyNotHeld(ctx, c)
	}
	return nil
}

// Release hands a claim back uncharged: 'pending', the attempt count untouched, and
// ssl_last_attempt_at restored to what it was before the claim, so the domain is
// claimable at once by any instance. Used at shutdown, and when the CA rate-limits or
// cannot be reached.
//
// A hand-back wakes every instance through the wake trigger (the row enters the
// claimable set), unless quiet: a hand-back because of a pause is for nobody, since
// the claim will not take the row before the pause ends, and a fleet handing back its
// orders at once would wake every instance for nothing.
func (q *Queue) Release(ctx context.Context, c issuing.Claim, quiet bool) error {
	return q.release(ctx, releaseSQL, []any{c.ID, c.Token}, c, quiet)
}

// Hold is Release for a claim that a pause holds back (reason: rate_limited for the
// CA's rate limit or the ledger of its limits, ca_unavailable for a CA that cannot be
// reached), recorded as a held event in the domain's history with the hand-back. The
// event's message names the pause, never its text: a CA's rate-limit detail may name
// another tenant's domain.
func (q *Queue) Hold(ctx context.Context, c issuing.Claim, quiet bool, reason string) error {
	msg := "held back: the CA's rate limit"
	if reason == "ca_unavailable" {
		msg = "held back: the CA cannot be reached; ordering resumes when it answers"
	}
	return q.release(ctx, holdSQL, []any{c.ID, c.Token, reason, msg}, c, quiet)
}

var releaseSQL = `
UPDATE proxy_domains SET
    ssl_status = 'pending', ssl_last_attempt_at = ssl_claim_prev_attempt_at, updated_at = now(),
    ` + releaseClaimSQL + `
WHERE ` + heldSQL + `
RETURNING 1::bigint`

var holdSQL = `
UPDATE proxy_domains SET
    ssl_status = 'pending', ssl_last_attempt_at = ssl_claim_prev_attempt_at, updated_at = now(),
    ` + releaseClaimSQL + `
WHERE ` + heldSQL + `
RETURNING ` + eventSQL("proxy_domains", "'held'", "$3::text", "$4::text")

func (q *Queue) release(ctx context.Context, sql string, args []any, c issuing.Claim, quiet bool) error {
	var one int64
	var err error
	if quiet {
		err = q.quietly(ctx, sql, args, &one)
	} else {
		err = q.db.QueryRow(ctx, sql, args...).Scan(&one)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return q.whyNotHeld(ctx, c)
	}
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	return nil
}
