package queue

import (
	"context"
	"fmt"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

// replaceProgressSQL counts the certificates due for replacement through the partial
// index on ari_window_start (only started windows), and the pace from the ledger's
// recent rows of the directories $1 (all when NULL).
var replaceProgressSQL = `
SELECT now(), due.n, due.earliest, done.n
FROM (SELECT count(*)::int AS n, min(c.expires_at) AS earliest
      FROM proxy_certificates c JOIN proxy_domains d ON d.domain = c.domain
      WHERE c.ari_window_start IS NOT NULL AND c.ari_window_start <= now()
        AND c.expires_at > now() AND c.auto_renew
        AND ` + managedSQL("d") + `) due,
     (SELECT count(*)::int AS n FROM certworker_ledger l
      WHERE l.directory = ANY (COALESCE($1::text[], (SELECT array_agg(DISTINCT directory) FROM certworker_acme_accounts)))
        AND l.at > now() - make_interval(secs => $2) AND l.renewal AND l.outcome = 'issued') done`

// queryRower is a connection, pool or transaction.
type queryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func readReplaceProgress(ctx context.Context, db queryRower, directories []string) (issuing.ReplaceProgress, error) {
	var p issuing.ReplaceProgress
	if err := db.QueryRow(ctx, replaceProgressSQL, directories, issuing.ReplacePaceWindow.Seconds()).
		Scan(&p.At, &p.Due, &p.EarliestExpiry, &p.Replaced); err != nil {
		return p, fmt.Errorf("read the progress of replacements: %w", err)
	}
	switch {
	case p.Due == 0:
		at := p.At
		p.DoneBy = &at
	case p.Replaced > 0:
		at := p.At.Add(time.Duration(float64(issuing.ReplacePaceWindow) * float64(p.Due) / float64(p.Replaced)))
		p.DoneBy = &at
	}
	return p, nil
}

// ReplaceProgress reads how the replacement of certificates whose window has started
// is going, at the pace of the CA at directory ("" for every CA).
func (q *Queue) ReplaceProgress(ctx context.Context, directory string) (issuing.ReplaceProgress, error) {
	var dirs []string
	if directory != "" {
		dirs = []string{directory}
	}
	return readReplaceProgress(ctx, q.db, dirs)
}
