package queue

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The limit ledger: the worker's own record of its orders,
// shared by every instance in certworker_ledger, checked against limits that mirror
// the CA's published ones before each order. An order the CA would refuse is not
// sent, and the domain waits, uncharged, for the window to free a slot.
//
// What counts, following Let's Encrypt's rules (Boulder's wfe2 and ra, its
// rate-limits documentation):
//   - orders per account: every order sent, but renewals, which Let's Encrypt
//     neither checks nor counts;
//   - certificates per registered domain: certificates issued or in flight, but
//     renewals, which are exempt the same way;
//   - certificates per exact set (one name here): every certificate issued or in
//     flight, renewals included, which Let's Encrypt checks and counts too;
//   - failed authorizations per name: every order whose authorization failed,
//     renewals included.
//
// A renewal is an order for a domain that holds a certificate the CA issued: it names
// the certificate it replaces (ARI) and asks for the same single name, which Let's
// Encrypt recognises as a renewal either way. "The CA issued" is the ledger's own
// record of the names it saw the CA issue for (certworker_issued_names): a certificate
// someone else stored proves nothing to the CA.
//
// "In flight" is 'pending', and 'unknown' for an order whose end never reached the
// ledger (SettleStaleLedger): both count as the CA may count them.
//
// An ARI renewal is exempt from every limit, so that a CA's mass revocation is
// replaced at once: a renewal that names the
// certificate it replaces ("replaces", RFC 9773) while the database's time is inside
// the renewal window last read for that certificate (ari_window_start, ari_window_end).
// Let's Encrypt checks no limit for it: "Limit Exemptions for Renewals" in
// https://letsencrypt.org/docs/rate-limits/, and Boulder's wfe2, which skips its
// new-order limits when the order is an ARI renewal. No ledger pause holds it back
// either (claimSQL). It is still recorded (renewal and exempt), and counts as a
// certificate of its name against later orders that are not exempt, as the CA counts
// the certificate it issues. Any other renewal of the name (its window over, a change
// of profile, a certificate with no window read) is exempt only from orders per
// account and certificates per registered domain, and no ledger pause of those holds
// it back.

// Admission is a claim the ledger is asked about before its order.
type Admission struct {
	Claim issuing.Claim
	// Name is the name to order (CheckName's), RegisteredDomain its registered
	// domain (RegisteredDomain).
	Name, RegisteredDomain string
	// Renewal: the domain holds a certificate this order replaces, and names it in
	// the order ("replaces"). Admit counts it as a renewal only when the CA has
	// issued for the name before.
	Renewal bool

	// exempt: Admit found the renewal inside the renewal window last read for the
	// certificate it replaces (ariExemptSQL): no limit applies.
	exempt bool
}

// Refusal is a claim the ledger refused: handed back uncharged, with why.
type Refusal struct {
	Claim  issuing.Claim
	Reason string
}

// ledgerCount is what the ledger holds for one limit and key: how many rows count,
// and when the oldest of them leaves the window.
type ledgerCount struct {
	n     int
	frees *time.Time
}

// ledgerKey names one limit applied to one key.
type ledgerKey struct{ kind, key string }

// Admit checks claims (in the order given) against limits and records the ones that
// may go, in one transaction under the ledger's lock (inLedger), so that two
// instances never exceed a limit together. A claim the CA would refuse is handed back
// uncharged and quietly (no wake-up: the pause holds it), and what it hit is paused,
// source 'ledger', until the window frees a slot, with the reason for `status`. A key
// that reaches its limit with this batch is paused at once, so that the next claim
// does not take it in the first place.
//
// An admission that says it is a renewal counts as one only when the CA has issued a
// certificate for the name before (certworker_issued_names, written by SettleLedger):
// a certificate someone else stored does not exempt the order from the limits the CA
// applies to new ones.
//
// When it returns an error, nothing was recorded, unless the error wraps
// ErrCommitUnknown: then the claims' rows may be there, and the caller, which places
// none of their orders, settles them as not sent (LedgerNotSent) once it can; a
// token without a row is matched by nothing.
func (q *Queue) Admit(ctx context.Context, directory string, limits issuing.Limits, as []Admission) (admitted []issuing.Claim, refused []Refusal, err error) {
	as, err = q.knownRenewals(ctx, directory, as)
	if err != nil {
		return nil, nil, fmt.Errorf("ledger: %w", err)
	}
	err = q.inLedger(ctx, directory, func(tx pgx.Tx) error {
		admitted, refused = nil, nil
		counts, err := ledgerCounts(ctx, tx, directory, limits, as)
		if err != nil {
			return err
		}
		if err := reserveCounts(ctx, tx, directory, limits, as, counts); err != nil {
			return err
		}
		d := ledgerDecision{limits: limits, directory: directory, counts: counts}
		for _, a := range as {
			if why := d.admit(a); why != "" {
				refused = append(refused, Refusal{Claim: a.Claim, Reason: why})
			} else {
				admitted = append(admitted, a.Claim)
				d.record(a)
			}
		}
		return d.write(ctx, tx, refused)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("ledger: %w", err)
	}
	return admitted, refused, nil
}

// knownRenewals returns as with Renewal cleared where the order is no renewal to the
// CA at directory by the claim's own rule (renewalSQL: its certificate is not this
// CA's, or the CA has not issued for the name before), and exempt set where the renewal falls
// inside the window last read for its certificate (ariExemptSQL, on the database's
// clock). Read outside the ledger's lock: a name recorded meanwhile only makes a
// renewal count as a new order, the safe side; a window read meanwhile, or one that
// ends meanwhile, is a read a moment earlier.
func (q *Queue) knownRenewals(ctx context.Context, directory string, as []Admission) ([]Admission, error) {
	var names, domains []string
	for _, a := range as {
		if a.Renewal {
			names, domains = append(names, a.Name), append(domains, a.Claim.Domain)
		}
	}
	if len(names) == 0 {
		return as, nil
	}
	second, args := "", []any{directory, names, domains}
	if q.cfg.Fallback != nil {
		second, args = "$4", append(args, q.cfg.Fallback.Directory)
	}
	rows, err := q.db.Query(ctx, `
SELECT r.name, `+renewalSQL("r.domain", "$1", second)+`, `+ariWindowSQL("r.domain")+`
FROM unnest($2::text[], $3::text[]) AS r(name, domain)`, args...)
	if err != nil {
		return nil, fmt.Errorf("read names issued before: %w", err)
	}
	type known struct{ issued, inWindow bool }
	byName := map[string]known{}
	for rows.Next() {
		var name string
		var k known
		if err := rows.Scan(&name, &k.issued, &k.inWindow); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read names issued before: %w", err)
		}
		byName[name] = k
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read names issued before: %w", err)
	}
	out := slices.Clone(as)
	for i := range out {
		if !out[i].Renewal {
			continue
		}
		k := byName[out[i].Name]
		out[i].Renewal = k.issued
		out[i].exempt = k.issued && k.inWindow
	}
	return out, nil
}

// The ledger's lock: how long one try waits for it, and the pause between tries.
const (
	// ledgerLockWait: the lock is held for a few milliseconds (a count and an insert)
	// by a live instance. Waiting longer means its holder is stuck or cut off (the
	// server ends that transaction after the worker session's
	// idle_in_transaction_session_timeout); a try that gives up is retried, so that
	// the wait ends with the caller's context and is never one the server keeps
	// queued for a client that has gone.
	ledgerLockWait = time.Second
	// ledgerRetryPause is the pause between tries, with as much again of jitter, so
	// that instances retrying together do not arrive together.
	ledgerRetryPause = 50 * time.Millisecond
)

// inLedger runs fn in a transaction that holds the ledger's lock of directory, a
// transaction-scoped advisory lock every instance takes to read and write the ledger
// and its pauses. The lock is waited for ledgerLockWait at a time (lock_timeout for
// this transaction only) and tried again until ctx ends, then ErrLedgerBusy. The
// transaction's statements are bounded by what is left of ctx (statement_timeout),
// so the server gives up on them when the caller does.
func (q *Queue) inLedger(ctx context.Context, directory string, fn func(pgx.Tx) error) error {
	for try := 1; ; try++ {
		locked, err := q.ledgerTx(ctx, directory, fn)
		if locked || err == nil || !isLockTimeout(err) && !isStatementTimeout(err) && ctx.Err() == nil {
			return err
		}
		t := time.NewTimer(ledgerRetryPause + rand.N(ledgerRetryPause))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (%d tries of %s): %w", issuing.ErrLedgerBusy, try, ledgerLockWait, err)
		case <-t.C:
		}
	}
}

var ledgerLockSQL = `SELECT pg_advisory_xact_lock(hashtext('certworker_ledger'), hashtext($1))`

// ledgerTx is one try of inLedger; locked reports that it got as far as holding the
// lock. An error of its COMMIT wraps ErrCommitUnknown.
func (q *Queue) ledgerTx(ctx context.Context, directory string, fn func(pgx.Tx) error) (locked bool, err error) {
	tx, err := q.db.Begin(ctx)
	if err != nil {
		return false, err
	}
	err = func() error {
		b := &pgx.Batch{}
		b.Queue(`SELECT set_config('lock_timeout', $1, true)`, milliseconds(ledgerLockWait))
		if deadline, ok := ctx.Deadline(); ok {
			b.Queue(`SELECT set_config('statement_timeout', $1, true)`, milliseconds(time.Until(deadline)))
		}
		b.Queue(ledgerLockSQL, directory)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("ledger lock: %w", err)
		}
		locked = true
		return fn(tx)
	}()
	if err != nil {
		// After a failed statement, or with ctx over, the rollback may fail too: the
		// connection is then closed, which ends the transaction just as well.
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return locked, err
	}
	if err := tx.Commit(ctx); err != nil {
		return true, fmt.Errorf("%w: %w", issuing.ErrCommitUnknown, err)
	}
	return true, nil
}

// isLockTimeout reports whether err is a lock wait that gave up (SQLSTATE 55P03,
// lock_not_available).
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// isStatementTimeout reports whether err is a statement the server cancelled
// (SQLSTATE 57014): while the lock is waited for, the statement_timeout that mirrors
// the caller's deadline, which the server may reach a moment before the caller's
// context says it is over. Such a wait is retried like a lock timeout until ctx ends.
func isStatementTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57014"
}

// milliseconds is d as a setting's value in milliseconds, at least 1 (0 turns a
// timeout off).
func milliseconds(d time.Duration) string {
	return strconv.FormatInt(max(d.Milliseconds(), 1), 10)
}

var ledgerCountsSQL = `
SELECT 'account', $1::text, count(*), min(at) + make_interval(secs => $2) FROM certworker_ledger
 WHERE $2 > 0 AND directory = $1 AND at > now() - make_interval(secs => $2) AND outcome <> 'not_sent' AND NOT renewal
UNION ALL
SELECT 'registered_domain', registered_domain, count(*), min(at) + make_interval(secs => $3) FROM certworker_ledger
 WHERE $3 > 0 AND directory = $1 AND registered_domain = ANY($4) AND at > now() - make_interval(secs => $3)
   AND outcome IN ('pending', 'issued', 'unknown') AND NOT renewal
 GROUP BY registered_domain
UNION ALL
SELECT 'exact_set', name, count(*), min(at) + make_interval(secs => $5) FROM certworker_ledger
 WHERE $5 > 0 AND directory = $1 AND name = ANY($6) AND at > now() - make_interval(secs => $5)
   AND outcome IN ('pending', 'issued', 'unknown')
 GROUP BY name
UNION ALL
SELECT 'failed_authz', name, count(*), min(at) + make_interval(secs => $7) FROM certworker_ledger
 WHERE $7 > 0 AND directory = $1 AND name = ANY($6) AND at > now() - make_interval(secs => $7)
   AND outcome = 'failed_authz'
 GROUP BY name`

// ledgerCounts reads, for every limit that is on, what counts for the keys of as.
func ledgerCounts(ctx context.Context, tx pgx.Tx, directory string, l issuing.Limits, as []Admission) (map[ledgerKey]ledgerCount, error) {
	var rds, names []string
	for _, a := range as {
		rds, names = append(rds, a.RegisteredDomain), append(names, a.Name)
	}
	rows, err := tx.Query(ctx, ledgerCountsSQL,
		directory, seconds(l.OrdersPerAccount.ActiveWindow()), seconds(l.CertsPerRegisteredDomain.ActiveWindow()), rds,
		seconds(l.CertsPerExactSet.ActiveWindow()), names, seconds(l.FailedAuthzPerName.ActiveWindow()))
	if err != nil {
		return nil, fmt.Errorf("count orders: %w", err)
	}
	defer rows.Close()
	counts := map[ledgerKey]ledgerCount{}
	for rows.Next() {
		var k ledgerKey
		var c ledgerCount
		if err := rows.Scan(&k.kind, &k.key, &c.n, &c.frees); err != nil {
			return nil, fmt.Errorf("count orders: %w", err)
		}
		counts[k] = c
	}
	return counts, rows.Err()
}

// ledgerDecision applies the limits to a batch, counting what it admits.
type ledgerDecision struct {
	limits    issuing.Limits
	directory string
	counts    map[ledgerKey]ledgerCount
	rows      []Admission
	// full are the keys at their limit, to pause, with the reason.
	full map[ledgerKey]string
}

// checks are the limits that apply to a, with their keys and flags.
func (d *ledgerDecision) checks(a Admission) []struct {
	k     ledgerKey
	limit issuing.Limit
	flag  string
	what  string
} {
	type check = struct {
		k     ledgerKey
		limit issuing.Limit
		flag  string
		what  string
	}
	var out []check
	if !a.Renewal {
		out = append(out,
			check{ledgerKey{"account", d.directory}, d.limits.OrdersPerAccount, "--limit-orders-per-account", "new orders from the account"},
			check{ledgerKey{"registered_domain", a.RegisteredDomain}, d.limits.CertsPerRegisteredDomain, "--limit-certs-per-registered-domain", "new certificates for " + a.RegisteredDomain})
	}
	return append(out,
		check{ledgerKey{"exact_set", a.Name}, d.limits.CertsPerExactSet, "--limit-certs-per-exact-set", "certificates for " + a.Name},
		check{ledgerKey{"failed_authz", a.Name}, d.limits.FailedAuthzPerName, "--limit-failed-authz-per-name", "failed authorizations for " + a.Name})
}

// admit returns why a must wait, or "". An ARI renewal never waits.
func (d *ledgerDecision) admit(a Admission) string {
	if a.exempt {
		return ""
	}
	for _, c := range d.checks(a) {
		if c.limit.Off() {
			continue
		}
		if n := d.counts[c.k].n; n >= c.limit.Count {
			why := fmt.Sprintf("ledger: %d %s in %s (%s %s)", n, c.what, c.limit.Window, c.flag, c.limit)
			d.markFull(c.k, why)
			return why
		}
	}
	return d.reserveHolds(a)
}

// record counts an admitted claim; a key it brings to its limit is paused.
func (d *ledgerDecision) record(a Admission) {
	d.rows = append(d.rows, a)
	d.recordReserve(a)
	for _, c := range d.checks(a) {
		if c.limit.Off() || c.k.kind == "failed_authz" {
			continue
		}
		cnt := d.counts[c.k]
		cnt.n++
		d.counts[c.k] = cnt
		if cnt.n >= c.limit.Count {
			d.markFull(c.k, fmt.Sprintf("ledger: %d %s in %s (%s %s)", cnt.n, c.what, c.limit.Window, c.flag, c.limit))
		}
	}
}

func (d *ledgerDecision) markFull(k ledgerKey, why string) {
	if d.full == nil {
		d.full = map[ledgerKey]string{}
	}
	d.full[k] = why
}

// Window is the window of a limit kind.
func (d *ledgerDecision) window(kind string) time.Duration {
	switch kind {
	case "account", issuing.ScopeTenant:
		return d.limits.OrdersPerAccount.Window
	case "registered_domain":
		return d.limits.CertsPerRegisteredDomain.Window
	case "exact_set":
		return d.limits.CertsPerExactSet.Window
	}
	return d.limits.FailedAuthzPerName.Window
}

// ledgerInsertSQL records an admitted order, about to be sent, and the ordered event
// of its domain's history with it.
var ledgerInsertSQL = `
WITH l AS (
    INSERT INTO certworker_ledger (directory, domain_id, name, registered_domain, renewal, exempt, claim_token, tenant_id)
    VALUES ($1, $2, $3, $4, $5, $6, $7, NULLIF($8, '')::uuid)
    RETURNING domain_id, tenant_id
)
SELECT certworker_domain_event(domain_id, tenant_id, 'ordered', NULL, NULL, now()) FROM l
WHERE domain_id IS NOT NULL AND tenant_id IS NOT NULL`

// ledgerHandBackSQL hands back a claim the ledger refused, uncharged, recorded as a
// hold of the domain.
var ledgerHandBackSQL = `
UPDATE proxy_domains SET
    ssl_status = 'pending', ssl_last_attempt_at = ssl_claim_prev_attempt_at, updated_at = now(),
    ` + releaseClaimSQL + `
WHERE ` + heldSQL + `
RETURNING ` + eventSQL("proxy_domains", "'held'", "'rate_limited'",
	"'held back: the CA''s limits on orders are used up until the next one is allowed'")

var ledgerPauseSQL = `
INSERT INTO certworker_pauses AS p (directory, scope, key, source, paused_until, reason, held_since)
VALUES ($6, $1, $2, 'ledger', COALESCE($3, now() + make_interval(secs => $4)), $5, now())
ON CONFLICT (directory, scope, key, source) DO UPDATE SET
    held_since = ` + heldSinceSQL + `,
    paused_until = EXCLUDED.paused_until, reason = EXCLUDED.reason, updated_at = now()`

// write records the admitted orders, hands the refused claims back quietly, and
// pauses the keys at their limit until their oldest counted row leaves the window
// (a window of rows all recorded now frees a slot a window from now).
func (d *ledgerDecision) write(ctx context.Context, tx pgx.Tx, refused []Refusal) error {
	b := &pgx.Batch{}
	b.Queue(`SELECT set_config('certworker.quiet', 'on', true)`)
	for _, a := range d.rows {
		b.Queue(ledgerInsertSQL, d.directory, a.Claim.ID, a.Name, a.RegisteredDomain, a.Renewal, a.exempt,
			a.Claim.Token, a.Claim.TenantID)
	}
	for _, r := range refused {
		b.Queue(ledgerHandBackSQL, r.Claim.ID, r.Claim.Token)
	}
	for k, why := range d.full {
		scope, key := issuing.ScopeDomain, k.key
		switch k.kind {
		case "account":
			scope = issuing.ScopeCA
		case "registered_domain":
			scope = issuing.ScopeRegisteredDomain
		case issuing.ScopeTenant:
			scope = issuing.ScopeTenant
		}
		var frees *time.Time
		if c, ok := d.counts[k]; ok {
			frees = c.frees
		}
		b.Queue(ledgerPauseSQL,
			scope, key, frees, seconds(d.window(k.kind)), why, d.directory)
	}
	return tx.SendBatch(ctx, b).Close()
}

var readmitSQL = `
DELETE FROM certworker_ledger WHERE directory = $1 AND claim_token = $2`

// Readmit asks the ledger again, as a new order (not a renewal, not exempt), about a
// claim Admit admitted as a renewal, whose order is about to go without "replaces"
// (Request.Readmit): the CA counts it as a new order then, and the ledger must not let
// it past a limit it admitted it past as a renewal. Under the ledger's lock, the
// claim's own row is left out of the counts and written again as what it now is. A
// refusal returns a *LedgerRefusedError, pauses what the order hit, as Admit does, and
// leaves no row for the claim (the order is not sent).
func (q *Queue) Readmit(ctx context.Context, directory string, limits issuing.Limits, a Admission) error {
	a.Renewal, a.exempt = false, false
	var why string
	err := q.inLedger(ctx, directory, func(tx pgx.Tx) error {
		why = ""
		if _, err := tx.Exec(ctx, readmitSQL, directory, a.Claim.Token); err != nil {
			return err
		}
		counts, err := ledgerCounts(ctx, tx, directory, limits, []Admission{a})
		if err != nil {
			return err
		}
		// As a new order it is under the tenant reserve too, as in Admit.
		if err := reserveCounts(ctx, tx, directory, limits, []Admission{a}, counts); err != nil {
			return err
		}
		d := ledgerDecision{limits: limits, directory: directory, counts: counts}
		if why = d.admit(a); why == "" {
			d.record(a)
		}
		return d.write(ctx, tx, nil)
	})
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	if why != "" {
		return &issuing.LedgerRefusedError{Reason: why}
	}
	return nil
}

var settleLedgerSQL = `
WITH l AS (
    UPDATE certworker_ledger SET outcome = $2 WHERE claim_token = $1 AND outcome IN ('pending', 'unknown')
    RETURNING name, registered_domain, tenant_id
), issued AS (
    INSERT INTO certworker_issued_names AS n (directory, name)
    SELECT $3, name FROM l WHERE $2 = 'issued'
    ON CONFLICT (directory, name) DO UPDATE SET issued_at = now()
), lifted AS (
    DELETE FROM certworker_pauses p USING l
    WHERE p.source = 'ledger' AND $2 NOT IN ('pending', 'issued') AND p.directory IN ($3, '')
      AND ((p.scope = 'registered_domain' AND p.key = l.registered_domain)
        OR (p.scope = 'domain' AND p.key = l.name AND $2 <> 'failed_authz')
        OR (p.scope = 'ca' AND p.key = $3 AND $2 = 'not_sent')
        OR (p.scope = 'tenant' AND p.key = l.tenant_id::text AND $2 = 'not_sent'))
), authz AS (
    SELECT l.name, count(*) AS n, min(c.at) + make_interval(secs => $5) AS frees
    FROM l JOIN certworker_ledger c ON c.name = l.name AND c.directory = $3
    WHERE $2 = 'failed_authz' AND $4 > 0 AND c.at > now() - make_interval(secs => $5)
      AND (c.outcome = 'failed_authz' OR c.claim_token = $1)
    GROUP BY l.name
)
INSERT INTO certworker_pauses AS p (directory, scope, key, source, paused_until, reason, held_since)
SELECT $3, 'domain', name, 'ledger', frees,
       format('ledger: %s failed authorizations for %s in %s (--limit-failed-authz-per-name %s)', n, name, $6::text, $7::text),
       now()
FROM authz WHERE n >= $4
ON CONFLICT (directory, scope, key, source) DO UPDATE SET
    held_since = ` + heldSinceSQL + `,
    paused_until = EXCLUDED.paused_until, reason = EXCLUDED.reason, updated_at = now()`

// SettleLedger records how the order of claim token ended, under the ledger's lock:
// the pauses it lifts or writes are the ledger's, which Admit writes under the same
// lock, and a lift that raced an Admit could leave a pause the counts no longer
// justify, for as long as a window (a week).
//
// An outcome that does not count as a certificate (a failure, nothing sent) lifts the
// ledger's pauses of the order's name and registered domain, and of the account when
// nothing was sent: the next claim counts again and pauses them anew if they are still
// full. A failed authorization that brings its name to the limit pauses the name (and
// leaves a pause the name already had: one statement may not delete and insert one
// row). An issued certificate records that the CA has issued for the name
// (certworker_issued_names), which makes its later orders renewals. A row recorded
// as unknown (SettleStaleLedger) takes the outcome that arrives late.
func (q *Queue) SettleLedger(ctx context.Context, directory, token, outcome string, limits issuing.Limits) error {
	err := q.inLedger(ctx, directory, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, settleLedgerSQL,
			token, outcome, directory, limits.FailedAuthzPerName.Count, seconds(limits.FailedAuthzPerName.ActiveWindow()),
			limits.FailedAuthzPerName.Window.String(), limits.FailedAuthzPerName.String())
		return err
	})
	if err != nil {
		return fmt.Errorf("settle ledger: %w", err)
	}
	return nil
}

var settleStaleLedgerSQL = `
WITH stale AS (
    SELECT ctid FROM certworker_ledger
    WHERE directory = $1 AND outcome = 'pending' AND at < now() - make_interval(secs => $2)
    LIMIT $3
    FOR UPDATE SKIP LOCKED)
UPDATE certworker_ledger l SET outcome = 'unknown'
FROM stale WHERE l.ctid = stale.ctid`

// SettleStaleLedger records as unknown (LedgerUnknown) the orders of the CA at
// directory still pending after olderThan, which the caller makes longer than any
// order can live: their instance died, or lost the answer of the COMMIT that recorded
// them and could not settle them. A pending row would count for as long as a window
// (a week) as an order in flight, and never take its real outcome; unknown counts
// the same, as the CA may have counted the order, and is replaced by the real outcome
// if that arrives late. No pause changes (the counts do not), so the ledger's lock is
// not taken. It returns how many rows it settled.
func (q *Queue) SettleStaleLedger(ctx context.Context, directory string, olderThan time.Duration) (int64, error) {
	// A row another transaction holds locked (its late settle) is passed over, not
	// waited for; fillBatch rows a statement.
	var total int64
	for {
		tag, err := q.db.Exec(ctx, settleStaleLedgerSQL,
			directory, seconds(olderThan), fillBatch)
		if err != nil {
			return total, fmt.Errorf("settle stale ledger rows: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < fillBatch {
			return total, nil
		}
	}
}
