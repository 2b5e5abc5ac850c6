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

// durationFromSeconds turns a delay from secondsUntilSQL into a duration: a past
// time is 0, one too far (infinity included) the longest Duration.
func durationFromSeconds(s float64) time.Duration {
	switch {
	case math.IsNaN(s) || s <= 0:
		return 0
	case s >= float64(math.MaxInt64)/float64(time.Second):
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(s * float64(time.Second))
}

// MarkActive stores the certificate and turns the domain active in one statement, so
// the proxy never sees one without the other, and returns how long until renewal. It
// records the profile and issuing CA, and forgets the CAs' refusals, the DNS wait's
// clock and pace, and the recorded order. ssl_error becomes NULL, or the note of a
// refused profile while the domain still names it. A domain whose ssl_profile changed mid-order goes back to
// pending (profileMovedOnSQL). Nothing is written when the claim is lost
// (ErrClaimLost) or the domain no longer ACME (ErrNotACME).
//
// The upsert sets the parameters, not EXCLUDED's columns: reading
// EXCLUDED.private_key_pem needs SELECT on it, which the workers' role lacks
// (deploy/grants.sql), so a stolen worker password reads no keys.
func (q *Queue) MarkActive(ctx context.Context, c issuing.Claim, cert *issuing.Certificate) (time.Duration, error) {
	renewAt := cert.RenewAt
	if renewAt.IsZero() {
		// No renewal time from the issuer must not make the certificate due at once.
		renewAt = issuing.RenewAtFromValidity(cert.NotBefore, cert.NotAfter)
	}
	var renewIn float64
	sql, args := markActiveStatement(c, cert, renewAt, nullString(q.errorText(ctx, c.Notice)))
	err := q.db.QueryRow(ctx, sql, args...).Scan(&renewIn)
	if errors.Is(err, pgx.ErrNoRows) {
		why := q.whyNotHeld(ctx, c)
		if errors.Is(why, issuing.ErrClaimLost) && q.storedAlready(ctx, c, cert) {
			// A retry of a store that committed, whose answer was lost (cut off by its
			// deadline as it committed): the write it repeats is done.
			return time.Until(renewAt), nil
		}
		return 0, why
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
    UPDATE certworker_dns_state SET waiting_since = NULL, paced_since = NULL, updated_at = now()
    WHERE domain_id = $1 AND (waiting_since IS NOT NULL OR paced_since IS NOT NULL) AND EXISTS (SELECT 1 FROM d)
), o AS (
    DELETE FROM certworker_orders WHERE domain_id = $1 AND EXISTS (SELECT 1 FROM d)
)
SELECT ` + secondsUntilSQL("renew_at") + ` FROM c`

// markActiveStatement is MarkActive's statement and arguments; notice is ssl_error's
// note, or NULL.
func markActiveStatement(c issuing.Claim, cert *issuing.Certificate, renewAt time.Time, notice *string) (string, []any) {
	return markActiveSQL, []any{
		c.ID, c.Token, cert.NotAfter, cert.ChainPEM, cert.PrivateKey, cert.NotBefore,
		cert.Issuer, cert.Serial, renewAt, issuing.RenewBy(cert.NotBefore, cert.NotAfter, cert.WindowEnd),
		nullTime(cert.WindowEnd), nullSeconds(cert.RenewalInfoIn), nullString(cert.Profile),
		nullString(c.ProfileRefused), notice, nullTime(cert.WindowStart), nullString(cert.Directory)}
}

func nullSeconds(d time.Duration) *float64 {
	if d <= 0 {
		return nil
	}
	s := seconds(d)
	return &s
}

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

// whyNotHeld tells ErrClaimLost from ErrNotACME after a finishing write matched
// nothing.
func (q *Queue) whyNotHeld(ctx context.Context, c issuing.Claim) error {
	// A switch away from acme drops the claim too, and is the reason to give.
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

// storedAlready reports whether c's domain holds cert, the certificate a store of c
// wrote: nobody else has this certificate, so the store that wrote it was c's.
func (q *Queue) storedAlready(ctx context.Context, c issuing.Claim, cert *issuing.Certificate) bool {
	var ours bool
	err := q.db.QueryRow(ctx, `
SELECT EXISTS (SELECT 1 FROM proxy_certificates c JOIN proxy_domains d ON d.domain = c.domain
               WHERE d.id = $1 AND c.serial = $2 AND c.certificate_pem = $3)`,
		c.ID, cert.Serial, cert.ChainPEM).Scan(&ours)
	return err == nil && ours
}

var disownSQL = `
UPDATE proxy_domains SET ` + releaseClaimSQL + ` WHERE id = $1 AND ssl_claim_token = $2`

// Disown drops this claim from a row no longer ACME, leaving its state to whoever
// changed the provider; it reports whether the claim was still held.
func (q *Queue) Disown(ctx context.Context, c issuing.Claim) (bool, error) {
	tag, err := q.db.Exec(ctx, disownSQL, c.ID, c.Token)
	if err != nil {
		return false, fmt.Errorf("disown claim: %w", err)
	}
	return tag.RowsAffected() > 0, nil
}

// MarkFailed records a failure: ssl_error (how an operator learns why), one more
// attempt, and back to 'pending', or 'failed' at the limit. The row goes out of line
// (HeldBackoff) quietly: the worker's timer covers its backoff.
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

// quietly runs one statement returning one row in a transaction marked as the
// worker's own (certworker.quiet), so the wake trigger does not notify, in one round
// trip.
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

// MarkPermanent fails a domain at once, whatever its attempts, with reason as
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

// Release hands a claim back uncharged: 'pending', attempts untouched, and
// ssl_last_attempt_at restored, so any instance may claim it at once. The wake
// trigger wakes every instance unless quiet (after a pause, nobody could take it).
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
