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

// The limit ledger (docs/cas.md, "The limit ledger"): the worker's own record of its
// orders, shared by every instance in certworker_ledger, and the token buckets of the
// limits that mirror the CA's published ones (certworker_buckets, bucket.go), checked
// before each order. An order the CA would refuse is not sent, and the domain waits,
// uncharged, for its bucket's next token.
//
// What takes a token, following Let's Encrypt's rules (Boulder's wfe2 and ra, its
// rate-limits documentation):
//   - orders per account: every order sent, but renewals, which Let's Encrypt
//     neither checks nor counts;
//   - certificates per registered domain: certificates issued or in flight, but
//     renewals, which are exempt the same way;
//   - certificates per exact set (one name here): every certificate issued or in
//     flight, renewals included, which Let's Encrypt checks and counts too;
//   - failed authorizations per name: every order whose authorization failed,
//     renewals included, when it fails (SettleLedger); an order is held back while
//     its name's bucket is empty;
//   - failed authorizations in a row (--limit-consecutive-failures): the same
//     failures, a bucket that a certificate issued for the name fills again; one
//     short of empty, the name is no longer ordered at the CA (ledgerDecision.stop).
//
// A certificate's tokens are taken when its order is admitted and given back when it
// ends without one; the account's, when the CA never saw the order.
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
	// Stopped: the name has failed validation too often in a row at this CA
	// (--limit-consecutive-failures). Rerouted: the claim was handed back for the
	// other CA; otherwise its domain was failed, with Reason as its ssl_error.
	Stopped, Rerouted bool
}

// Admit checks claims (in the order given) against limits and records the ones that
// may go, in one transaction under the ledger's lock (inLedger), so that two
// instances never exceed a limit together. A claim the CA would refuse is handed back
// uncharged and quietly (no wake-up: the pause holds it), and what it hit is paused,
// source 'ledger', until its bucket's next token, with the reason for `status`. A key
// whose bucket this batch empties is paused at once, so that the next claim does not
// take it in the first place. A claim whose name failed too often in a row (stop) is
// refused with Stopped set: handed to the other CA, or its domain failed.
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
		d, err := q.newDecision(ctx, tx, directory, limits, as)
		if err != nil {
			return err
		}
		for _, a := range as {
			stopped := len(d.stopped)
			switch why := d.admit(a); {
			case len(d.stopped) > stopped:
				refused = append(refused, d.stopped[stopped])
			case why != "":
				refused = append(refused, Refusal{Claim: a.Claim, Reason: why})
			default:
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

// ledgerDecision applies the limits to a batch, spending the tokens of what it admits.
type ledgerDecision struct {
	limits    issuing.Limits
	directory string
	// second is the second CA's directory, "" without one: with two CAs, a name
	// whose failures in a row stop it at one may go to the other.
	second  string
	buckets *buckets
	// tenants is what each tenant of the batch has ordered in the account's last
	// DURATION (the tenant reserve).
	tenants map[string]tenantUse
	rows    []Admission
	// full are the keys that must wait, to pause until paused_until, with the reason.
	full map[ledgerKey]pauseUntil
	// stopped are the claims whose name has failed too often in a row at this CA.
	stopped []Refusal
}

type pauseUntil struct {
	until time.Time
	why   string
}

// ledgerKey names one bucket: a limit's kind and its key.
type ledgerKey struct{ kind, key string }

// newDecision reads, under the ledger's lock, the buckets and tenants as can touch.
func (q *Queue) newDecision(ctx context.Context, tx pgx.Tx, directory string, limits issuing.Limits, as []Admission) (*ledgerDecision, error) {
	var rds, names []string
	for _, a := range as {
		rds, names = append(rds, a.RegisteredDomain), append(names, a.Name)
	}
	b, err := readBuckets(ctx, tx, directory, rds, names)
	if err != nil {
		return nil, err
	}
	tenants, err := reserveCounts(ctx, tx, directory, limits, as)
	if err != nil {
		return nil, err
	}
	d := &ledgerDecision{limits: limits, directory: directory, buckets: b, tenants: tenants}
	if f := q.cfg.Fallback; f != nil {
		d.second = f.Directory
	}
	return d, nil
}

// ledgerCheck is one limit that applies to an admission.
type ledgerCheck struct {
	k     ledgerKey
	limit issuing.Limit
	flag  string
	what  string
}

// checks are the buckets a's order must find a token in, and spends one of: orders
// per account and certificates per registered domain for a new order, certificates
// per exact set for any. Failed authorizations are checked here and spent when one
// fails (settle).
func (d *ledgerDecision) checks(a Admission) []ledgerCheck {
	var out []ledgerCheck
	if !a.Renewal {
		out = append(out,
			ledgerCheck{ledgerKey{bucketAccount, d.directory}, d.limits.OrdersPerAccount, "--limit-orders-per-account", "new orders from the account"},
			ledgerCheck{ledgerKey{bucketRegisteredDomain, a.RegisteredDomain}, d.limits.CertsPerRegisteredDomain, "--limit-certs-per-registered-domain", "new certificates for " + a.RegisteredDomain})
	}
	return append(out,
		ledgerCheck{ledgerKey{bucketExactSet, a.Name}, d.limits.CertsPerExactSet, "--limit-certs-per-exact-set", "certificates for " + a.Name},
		ledgerCheck{ledgerKey{bucketFailedAuthz, a.Name}, d.limits.FailedAuthzPerName, "--limit-failed-authz-per-name", "failed authorizations for " + a.Name})
}

// admit returns why a must wait, or "". An ARI renewal never waits for a token; a
// name that has failed too often in a row is stopped whatever the order (stop).
func (d *ledgerDecision) admit(a Admission) string {
	if why := d.stop(a); why != "" {
		return why
	}
	if a.exempt {
		return ""
	}
	for _, c := range d.checks(a) {
		if c.limit.Off() || d.buckets.tokens(c.k, c.limit) >= 1 {
			continue
		}
		why := fmt.Sprintf("ledger: no token left for %s (%s)", c.what, describe(c.flag, c.limit))
		d.markFull(c.k, d.buckets.holdsAt(c.k, c.limit, 1), why)
		return why
	}
	return d.reserveHolds(a)
}

// stop returns why a's name is no longer ordered at this CA, or "": its failed
// authorizations in a row have reached COUNT − 1 of --limit-consecutive-failures, one
// short of the CA's pause of the name for the whole account. The claim is then
// handed to the other CA (the routed claim sends a name this CA refused there) when
// there is one that has not stopped the name itself, and failed otherwise (write).
func (d *ledgerDecision) stop(a Admission) string {
	l := d.limits.ConsecutiveFailures
	k := ledgerKey{bucketConsecutive, a.Name}
	if l.Off() || d.buckets.tokens(k, l) > 1 {
		return ""
	}
	why := fmt.Sprintf("%s %s failed validation %d times in a row at this CA (--limit-consecutive-failures %d, "+
		"one forgiven a day); the CA would stop issuing for it. Point its DNS at the proxy (or fix what makes "+
		"its validation fail), then retry it", issuing.TooManyFailuresPrefix, a.Name, l.Count-d.buckets.tokens(k, l), l.Count)
	d.stopped = append(d.stopped, Refusal{Claim: a.Claim, Reason: why, Stopped: true,
		Rerouted: d.second != "" && (a.Claim.RefusedBy == "" || a.Claim.RefusedBy == d.directory)})
	return why
}

// record spends the tokens of an admitted claim; a bucket it empties is paused until
// its next token.
func (d *ledgerDecision) record(a Admission) {
	d.rows = append(d.rows, a)
	d.recordReserve(a)
	for _, c := range d.checks(a) {
		if c.limit.Off() || c.k.kind == bucketFailedAuthz {
			continue
		}
		d.buckets.spend(c.k, c.limit)
		if d.buckets.tokens(c.k, c.limit) < 1 {
			d.markFull(c.k, d.buckets.holdsAt(c.k, c.limit, 1),
				fmt.Sprintf("ledger: no token left for %s (%s)", c.what, describe(c.flag, c.limit)))
		}
	}
}

func (d *ledgerDecision) markFull(k ledgerKey, until time.Time, why string) {
	if d.full == nil {
		d.full = map[ledgerKey]pauseUntil{}
	}
	d.full[k] = pauseUntil{until, why}
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

// ledgerRerouteSQL hands a claim back as refused by this CA ($3) for too many
// failures in a row: the routed claim sends it to the other CA at once.
var ledgerRerouteSQL = `
UPDATE proxy_domains SET
    ssl_status = 'pending', ssl_last_attempt_at = ssl_claim_prev_attempt_at, updated_at = now(),
    ssl_ca_refused = $3, ssl_ca_refused_cause = '` + issuing.RefusedTooManyFailures + `',
    ` + releaseClaimSQL + `
WHERE ` + heldSQL

// ledgerStopSQL fails a claim's domain for too many failures in a row ($3, the
// reason): nothing was sent, and no attempt is charged.
var ledgerStopSQL = `
UPDATE proxy_domains SET
    ssl_status = 'failed', ssl_error = $3, updated_at = now(),
    ` + releaseClaimSQL + `
WHERE ` + heldSQL

var ledgerPauseSQL = `
INSERT INTO certworker_pauses AS p (directory, scope, key, source, paused_until, reason, held_since)
VALUES ($5, $1, $2, 'ledger', $3, $4, now())
ON CONFLICT (directory, scope, key, source) DO UPDATE SET
    held_since = ` + heldSinceSQL + `,
    paused_until = EXCLUDED.paused_until, reason = EXCLUDED.reason, updated_at = now()`

// pauseScope is the scope of the pause of a bucket's key.
func pauseScope(kind string) string {
	switch kind {
	case bucketAccount:
		return issuing.ScopeCA
	case bucketRegisteredDomain:
		return issuing.ScopeRegisteredDomain
	case issuing.ScopeTenant:
		return issuing.ScopeTenant
	}
	return issuing.ScopeDomain
}

// write records the admitted orders and the buckets they spent, sends the stopped
// names to the other CA or fails them, hands the refused claims back quietly, and
// pauses the keys that must wait until their next token.
func (d *ledgerDecision) write(ctx context.Context, tx pgx.Tx, refused []Refusal) error {
	b := &pgx.Batch{}
	// A name sent to the other CA wakes the workers (the routed claim takes it
	// there); the rest is quiet.
	for _, s := range d.stopped {
		if s.Rerouted {
			b.Queue(ledgerRerouteSQL, s.Claim.ID, s.Claim.Token, d.directory)
		}
	}
	b.Queue(`SELECT set_config('certworker.quiet', 'on', true)`)
	for _, s := range d.stopped {
		if !s.Rerouted {
			b.Queue(ledgerStopSQL, s.Claim.ID, s.Claim.Token, s.Reason)
		}
	}
	for _, a := range d.rows {
		b.Queue(ledgerInsertSQL, d.directory, a.Claim.ID, a.Name, a.RegisteredDomain, a.Renewal, a.exempt,
			a.Claim.Token, a.Claim.TenantID)
	}
	d.buckets.queue(b)
	for _, r := range refused {
		if !r.Stopped {
			b.Queue(ledgerHandBackSQL, r.Claim.ID, r.Claim.Token)
		}
	}
	for k, p := range d.full {
		b.Queue(ledgerPauseSQL, pauseScope(k.kind), k.key, p.until, p.why, d.directory)
	}
	return tx.SendBatch(ctx, b).Close()
}

var readmitSQL = `
DELETE FROM certworker_ledger WHERE directory = $1 AND claim_token = $2
RETURNING outcome IN ('pending', 'unknown')`

// Readmit asks the ledger again, as a new order (not a renewal, not exempt), about a
// claim Admit admitted as a renewal, whose order is about to go without "replaces"
// (Request.Readmit): the CA counts it as a new order then, and the ledger must not let
// it past a limit it admitted it past as a renewal. Under the ledger's lock, the
// claim's own row is deleted and the token it took given back, and the order is
// admitted again as what it now is. A refusal returns a *LedgerRefusedError, pauses
// what the order hit, as Admit does, and leaves no row for the claim (the order is
// not sent); the caller hands the claim back.
func (q *Queue) Readmit(ctx context.Context, directory string, limits issuing.Limits, a Admission) error {
	a.Renewal, a.exempt = false, false
	var why string
	err := q.inLedger(ctx, directory, func(tx pgx.Tx) error {
		why = ""
		rows, err := tx.Query(ctx, readmitSQL, directory, a.Claim.Token)
		if err != nil {
			return err
		}
		counted, err := pgx.CollectRows(rows, pgx.RowTo[bool])
		if err != nil {
			return err
		}
		// As a new order it is under the tenant reserve too, as in Admit.
		d, err := q.newDecision(ctx, tx, directory, limits, []Admission{a})
		if err != nil {
			return err
		}
		for _, c := range counted {
			if c && !limits.CertsPerExactSet.Off() {
				d.buckets.refund(ledgerKey{bucketExactSet, a.Name}, limits.CertsPerExactSet)
			}
		}
		if why = d.admit(a); why == "" {
			d.record(a)
		}
		// A name stopped for its failures in a row is refused like any other here:
		// the caller holds the claim and hands it back, and the next Admit stops it.
		d.stopped = nil
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
    RETURNING name, registered_domain, tenant_id, renewal, exempt
), issued AS (
    INSERT INTO certworker_issued_names AS n (directory, name)
    SELECT $3, name FROM l WHERE $2 = 'issued'
    ON CONFLICT (directory, name) DO UPDATE SET issued_at = now()
), lifted AS (
    DELETE FROM certworker_pauses p USING l
    WHERE p.source = 'ledger' AND $2 NOT IN ('pending', 'issued') AND p.directory IN ($3, '')
      AND ((p.scope = 'registered_domain' AND p.key = l.registered_domain)
        OR (p.scope = 'domain' AND p.key = l.name)
        OR (p.scope = 'ca' AND p.key = $3 AND $2 = 'not_sent')
        OR (p.scope = 'tenant' AND p.key = l.tenant_id::text AND $2 = 'not_sent'))
)
SELECT name, registered_domain, renewal, exempt FROM l`

// settled is a ledger row SettleLedger gave its outcome.
type settled struct {
	name, registeredDomain string
	renewal, exempt        bool
}

// SettleLedger records how the order of claim token ended, under the ledger's lock:
// the buckets and pauses it changes are the ledger's, which Admit writes under the
// same lock.
//
// Tokens follow what the CA counts. An order that does not end in a certificate (a
// failure, nothing sent) gives back the certificate tokens it took, and an order the
// CA never saw (not sent) the account's too; it lifts the ledger's pauses of the
// order's name and registered domain (and of the account when nothing was sent):
// the next claim finds the token given back. A failed authorization that leaves its
// own bucket empty pauses the name again, in the same transaction. A failed authorization takes a token of
// failed authorizations per name, pausing the name when it was the last, and one of
// the name's failures in a row; an issued certificate fills that bucket again, as a
// success resets the CA's count, and records that the CA has issued for the name
// (certworker_issued_names), which makes its later orders renewals. A row recorded as
// unknown (SettleStaleLedger) takes the outcome that arrives late.
func (q *Queue) SettleLedger(ctx context.Context, directory, token, outcome string, limits issuing.Limits) error {
	err := q.inLedger(ctx, directory, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, settleLedgerSQL, token, outcome, directory)
		if err != nil {
			return err
		}
		var done []settled
		for rows.Next() {
			var s settled
			if err := rows.Scan(&s.name, &s.registeredDomain, &s.renewal, &s.exempt); err != nil {
				rows.Close()
				return err
			}
			done = append(done, s)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(done) == 0 {
			return nil
		}
		var rds, names []string
		for _, s := range done {
			rds, names = append(rds, s.registeredDomain), append(names, s.name)
		}
		b, err := readBuckets(ctx, tx, directory, rds, names)
		if err != nil {
			return err
		}
		batch := &pgx.Batch{}
		for _, s := range done {
			settleBuckets(batch, b, limits, s, outcome)
		}
		b.queue(batch)
		return tx.SendBatch(ctx, batch).Close()
	})
	if err != nil {
		return fmt.Errorf("settle ledger: %w", err)
	}
	return nil
}

// settleBuckets applies to b the outcome of order s (SettleLedger), and queues the
// pause of a name whose failed authorizations it used up.
func settleBuckets(batch *pgx.Batch, b *buckets, l issuing.Limits, s settled, outcome string) {
	refund := func(k ledgerKey, limit issuing.Limit) {
		if !limit.Off() {
			b.refund(k, limit)
		}
	}
	if outcome != issuing.LedgerIssued {
		if !s.renewal {
			refund(ledgerKey{bucketRegisteredDomain, s.registeredDomain}, l.CertsPerRegisteredDomain)
		}
		refund(ledgerKey{bucketExactSet, s.name}, l.CertsPerExactSet)
	}
	if outcome == issuing.LedgerNotSent && !s.renewal {
		refund(ledgerKey{bucketAccount, b.directory}, l.OrdersPerAccount)
	}
	switch outcome {
	case issuing.LedgerIssued:
		b.reset(ledgerKey{bucketConsecutive, s.name})
	case issuing.LedgerFailedAuthz:
		if c := l.ConsecutiveFailures; !c.Off() {
			b.spend(ledgerKey{bucketConsecutive, s.name}, c)
		}
		f, k := l.FailedAuthzPerName, ledgerKey{bucketFailedAuthz, s.name}
		if f.Off() {
			return
		}
		b.spend(k, f)
		if b.tokens(k, f) < 1 {
			batch.Queue(ledgerPauseSQL, issuing.ScopeDomain, s.name, b.holdsAt(k, f, 1),
				fmt.Sprintf("ledger: no token left for failed authorizations for %s (%s)", s.name,
					describe("--limit-failed-authz-per-name", f)), b.directory)
		}
	}
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
