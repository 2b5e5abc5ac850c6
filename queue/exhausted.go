package queue

import (
	"context"
	"fmt"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

// givenUpFormat ends the ssl_error of a domain FailExhausted gave up on.
const givenUpFormat = "(given up: %s attempts, at or above --max-attempts %s; `certworker retry` puts it back)"

// FailExhausted fails the claimable rows at or above --max-attempts (a lowered limit,
// a hand edit), which the claim never takes, and returns them. Their ssl_error keeps
// the last attempt's words, composed in Go to pass errorText. Locked rows wait;
// fillBatch rows a statement.
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
