package queue

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// duplicateError starts the ssl_error of a domain whose name another row holds in
// another case, as "invalid domain:" starts one no CA can issue for.
const duplicateError = "duplicate domain: "

// MarkCaseDuplicates marks 'failed' every acme domain whose name another row of
// proxy_domains holds in another case ("Shop.example" and "shop.example"), each with
// an ssl_error naming the others, and returns the rows it marked (a row already
// marked so is not returned again).
//
// The proxy's unique constraint is on the name as written, and a database that has
// years of rows may hold such a pair. Certificates are ordered for the name in lower
// case, so both rows would order the same certificate, twice the CA's rate limit for
// one name, and each would overwrite the other's: neither is ordered until an
// operator deletes one and retries the other. A claim under way is dropped with its
// claim (its result is not stored).
//
// Finding them reads the whole table once (about 0.1 s at 100,000 domains, joined on
// lower(domain)), so it belongs on a maintenance timer or the renewal pass, not on
// every wake-up. Marking them is a second statement, on their ids only: one statement
// doing both is planned for a third of the table and spends longer compiling it (JIT)
// than running it.
func (q *Queue) MarkCaseDuplicates(ctx context.Context) ([]BadRow, error) {
	rows, err := q.db.Query(ctx, `
SELECT a.id::text FROM proxy_domains a
WHERE a.ssl_provider = 'acme'
  AND EXISTS (SELECT 1 FROM proxy_domains b WHERE lower(b.domain) = lower(a.domain) AND b.id <> a.id)`)
	if err != nil {
		return nil, fmt.Errorf("find case duplicates: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("find case duplicates: %w", err)
	}
	var out []BadRow
	for len(ids) > 0 {
		n := min(len(ids), fillBatch)
		marked, err := q.markCaseDuplicates(ctx, ids[:n])
		out = append(out, marked...)
		if err != nil {
			return out, err
		}
		ids = ids[n:]
	}
	return out, nil
}

// markCaseDuplicates marks the rows of ids failed, each with an ssl_error naming the
// rows whose name it shares in another case. The reasons are worked out first and
// written through errorText (a name is the tenant's text). A row another transaction
// holds locked is passed over, and marked by a later run.
func (q *Queue) markCaseDuplicates(ctx context.Context, ids []string) ([]BadRow, error) {
	rows, err := q.db.Query(ctx, `
SELECT d.id::text, '`+duplicateError+`' || string_agg(o.domain || ' (' || o.id || ')', ', ' ORDER BY o.domain)
       || ' has the same name in another case; neither is ordered until one is deleted'
FROM proxy_domains d JOIN proxy_domains o ON lower(o.domain) = lower(d.domain) AND o.id <> d.id
WHERE d.id = ANY ($1::uuid[])
GROUP BY d.id`, ids)
	if err != nil {
		return nil, fmt.Errorf("mark case duplicates: %w", err)
	}
	type mark struct{ id, reason string }
	found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (mark, error) {
		var m mark
		err := r.Scan(&m.id, &m.reason)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("mark case duplicates: %w", err)
	}
	marked, reasons := make([]string, len(found)), make([]string, len(found))
	for i, m := range found {
		marked[i], reasons[i] = m.id, q.errorText(ctx, m.reason)
	}
	rows, err = q.db.Query(ctx, `
WITH marked AS (
    SELECT * FROM unnest($1::uuid[], $2::text[]) AS m (id, reason)
), free AS (
    SELECT d.id FROM proxy_domains d
    WHERE d.id IN (SELECT id FROM marked)
    FOR UPDATE SKIP LOCKED)
UPDATE proxy_domains d SET
    ssl_status = 'failed', ssl_error = marked.reason, updated_at = now(), `+releaseClaimSQL+`
FROM marked JOIN free USING (id)
WHERE d.id = marked.id
  AND (d.ssl_status <> 'failed' OR d.ssl_error IS DISTINCT FROM marked.reason)
RETURNING d.id::text, d.domain, d.ssl_error`, marked, reasons)
	if err != nil {
		return nil, fmt.Errorf("mark case duplicates: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BadRow, error) {
		var b BadRow
		err := r.Scan(&b.ID, &b.Domain, &b.Reason)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("mark case duplicates: %w", err)
	}
	return out, nil
}
