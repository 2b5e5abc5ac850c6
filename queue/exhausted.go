package queue

import (
	"context"
	"fmt"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

// givenUpFormat ends the ssl_error of a domain FailExhausted gave up on, after what
// the last attempt said (format(): the attempts, the limit).
const givenUpFormat = "(given up: %s attempts, at or above --max-attempts %s; `certworker retry` puts it back)"

// FailExhausted marks failed the claimable rows whose attempts are at or above the
// limit (--max-attempts) and returns them. The claim never takes them (attempts below
// the limit is one of its conditions) and no failure write reaches them, so without
// this they would wait in 'pending' for ever, never tried and never failed, and
// `status` would show them as retrying. They come from a --max-attempts lowered below
// the attempts of rows that were retrying, and from hand edits. A failure at the limit
// marks a domain failed; these get the same, and their ssl_error
// keeps what the last attempt said and adds why they stopped.
//
// Rows locked by someone else (a transaction of the proxy's) are skipped, not waited
// for, and left for the next run; fillBatch rows a statement. The rows leave the
// claimable set, so the wake trigger says nothing.
//
// The new ssl_error is composed here, not in SQL, so that it goes through errorText
// like every other (the last attempt's words stay, cut to leave room for why it
// stopped): read, then written, in one short transaction that holds the rows it read.
func (q *Queue) FailExhausted(ctx context.Context) ([]issuing.BadRow, error) {
	var out []issuing.BadRow
	for {
		batch, err := q.failExhausted(ctx)
		out = append(out, batch...)
		if err != nil {
			return out, fmt.Errorf("fail domains at the attempt limit: %w", err)
		}
		if len(batch) < fillBatch {
			return out, nil
		}
	}
}

var exhaustedRowsSQL = `
SELECT id::text, tenant_id::text, domain, COALESCE(ssl_error, ''), ssl_attempts FROM proxy_domains
WHERE ` + claimableAsSQL("") + `
  AND ssl_attempts >= $1
LIMIT $2
FOR UPDATE SKIP LOCKED`

var failExhaustedRowsSQL = `
UPDATE proxy_domains d SET ssl_status = 'failed', ssl_error = x.reason, updated_at = now()
FROM unnest($1::uuid[], $2::text[]) AS x (id, reason)
WHERE d.id = x.id
RETURNING ` + eventSQL("d", "'failed'", "'too_many_failures'", "d.ssl_error")

// failExhausted is one batch of FailExhausted.
func (q *Queue) failExhausted(ctx context.Context) ([]issuing.BadRow, error) {
	var out []issuing.BadRow
	ascii := q.asciiOnly(ctx)
	err := pgx.BeginFunc(ctx, q.db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, exhaustedRowsSQL, q.cfg.MaxAttempts, fillBatch)
		if err != nil {
			return err
		}
		var b issuing.BadRow
		var last string
		var attempts int
		var ids, reasons []string
		_, err = pgx.ForEachRow(rows, []any{&b.ID, &b.TenantID, &b.Domain, &last, &attempts}, func() error {
			b.Reason = sanitizeWithTail(last, fmt.Sprintf(givenUpFormat, fmt.Sprint(attempts), fmt.Sprint(q.cfg.MaxAttempts)), ascii)
			ids, reasons = append(ids, b.ID), append(reasons, b.Reason)
			out = append(out, b)
			return nil
		})
		if err != nil || len(ids) == 0 {
			return err
		}
		_, err = tx.Exec(ctx, failExhaustedRowsSQL, ids, reasons)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
