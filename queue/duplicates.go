package queue

import (
	"context"
	"fmt"
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
// It reads the whole table once, through the index on lower(domain) (migration 00006):
// tens of milliseconds at 100,000 domains, so it belongs on a maintenance timer or
// the renewal pass, not on every wake-up.
func (q *Queue) MarkCaseDuplicates(ctx context.Context) ([]BadRow, error) {
	rows, err := q.db.Query(ctx, `
WITH dup AS (
    SELECT lower(domain) AS name FROM proxy_domains GROUP BY 1 HAVING count(*) > 1
), marked AS (
    SELECT d.id,
           '`+duplicateError+`' || (
               SELECT string_agg(o.domain || ' (' || o.id || ')', ', ' ORDER BY o.domain)
               FROM proxy_domains o WHERE lower(o.domain) = dup.name AND o.id <> d.id)
           || ' has the same name in another case; neither is ordered until one is deleted'
           AS reason
    FROM dup JOIN proxy_domains d ON lower(d.domain) = dup.name
    WHERE d.ssl_provider = 'acme'
)
UPDATE proxy_domains d SET
    ssl_status = 'failed', ssl_error = marked.reason, updated_at = now(), `+releaseClaimSQL+`
FROM marked
WHERE d.id = marked.id
  AND (d.ssl_status <> 'failed' OR d.ssl_error IS DISTINCT FROM marked.reason)
RETURNING d.id::text, d.domain, d.ssl_error`)
	if err != nil {
		return nil, fmt.Errorf("mark case duplicates: %w", err)
	}
	defer rows.Close()
	var out []BadRow
	for rows.Next() {
		var b BadRow
		if err := rows.Scan(&b.ID, &b.Domain, &b.Reason); err != nil {
			return nil, fmt.Errorf("mark case duplicates: %w", err)
		}
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("mark case duplicates: %w", err)
	}
	return out, nil
}
