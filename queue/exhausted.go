package queue

import (
	"context"
	"fmt"
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
// marks a domain failed (CONTRACT.md §5); these get the same, and their ssl_error
// keeps what the last attempt said and adds why they stopped.
//
// Rows locked by someone else (a transaction of the proxy's) are skipped, not waited
// for, and left for the next run; fillBatch rows a statement. The rows leave the
// claimable set, so the wake trigger says nothing.
func (q *Queue) FailExhausted(ctx context.Context) ([]BadRow, error) {
	var out []BadRow
	for {
		rows, err := q.db.Query(ctx, `
WITH x AS (
    SELECT id FROM proxy_domains
    WHERE verification_status = 'verified' AND ssl_provider = 'acme' AND ssl_status = 'pending'
      AND ssl_attempts >= $1
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
UPDATE proxy_domains d SET
    ssl_status = 'failed',
    ssl_error = COALESCE(NULLIF(d.ssl_error, '') || ' ', '') || format($3, d.ssl_attempts, $1::int),
    updated_at = now()
FROM x
WHERE d.id = x.id
RETURNING d.id::text, d.domain, d.ssl_error`, q.cfg.MaxAttempts, fillBatch, givenUpFormat)
		if err != nil {
			return out, fmt.Errorf("fail domains at the attempt limit: %w", err)
		}
		n := 0
		for rows.Next() {
			var b BadRow
			if err := rows.Scan(&b.ID, &b.Domain, &b.Reason); err != nil {
				rows.Close()
				return out, fmt.Errorf("fail domains at the attempt limit: %w", err)
			}
			out = append(out, b)
			n++
		}
		if err := rows.Err(); err != nil {
			return out, fmt.Errorf("fail domains at the attempt limit: %w", err)
		}
		if n < fillBatch {
			return out, nil
		}
	}
}
