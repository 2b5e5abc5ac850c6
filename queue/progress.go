package queue

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
)

// ReplacePaceWindow is how far back the pace of replacements is measured: long
// enough to smooth over a batch of orders finishing together (a fleet's
// --concurrency of them), short enough to follow a CA that slows down or a fix that
// speeds things up within the quarter hour.
const ReplacePaceWindow = 15 * time.Minute

// ReplaceProgress is how a mass replacement is going (a CA's revocation: every renewal
// window moved to now; docs/runbook.md, CertworkerReplacementTooSlow): the certificates
// whose renewal window (ARI) has started and that are not yet replaced, and when, at
// the pace of the last ReplacePaceWindow, the last of them will be.
type ReplaceProgress struct {
	// At is the database's clock at the read.
	At time.Time `json:"at"`
	// Due counts the valid, auto-renewed certificates of verified acme domains whose
	// renewal window, as last read, has started (ari_window_start passed): each is
	// replaced as soon as it can be, and leaves the count when it is (its
	// replacement's window has not started).
	Due int `json:"replace_now"`
	// EarliestExpiry is the earliest notAfter among them (nil: none due).
	EarliestExpiry *time.Time `json:"earliest_expiry,omitempty"`
	// Replaced counts the renewals issued in the last ReplacePaceWindow, from the
	// ledger (none is recorded while every --limit-* is off).
	Replaced int `json:"replaced_recently"`
	// DoneBy is when the last due certificate is replaced at that pace: At when
	// none is due; nil when some are and none was replaced in the window (never, at
	// this pace).
	DoneBy *time.Time `json:"done_by,omitempty"`
}

// Late reports whether, at the current pace, some certificate expires before the
// replacements are done.
func (p ReplaceProgress) Late() bool {
	return p.Due > 0 && p.EarliestExpiry != nil && (p.DoneBy == nil || p.DoneBy.After(*p.EarliestExpiry))
}

// DoneBySeconds is DoneBy as Unix seconds, +Inf for never: what the alert compares
// with the earliest expiry.
func (p ReplaceProgress) DoneBySeconds() float64 {
	if p.DoneBy == nil {
		return math.Inf(1)
	}
	return float64(p.DoneBy.UnixNano()) / 1e9
}

// replaceProgressSQL counts the certificates due for replacement through the partial
// index on ari_window_start (migration 00016), which reads only the windows that
// have started: a handful while the fleet is healthy, every drilled certificate
// during a drill. The pace reads the ledger's recent rows of the directories $1
// (all the accounts' when NULL) through certworker_ledger_at_idx.
const replaceProgressSQL = `
SELECT now(), due.n, due.earliest, done.n
FROM (SELECT count(*)::int AS n, min(c.expires_at) AS earliest
      FROM proxy_certificates c JOIN proxy_domains d ON d.domain = c.domain
      WHERE c.ari_window_start IS NOT NULL AND c.ari_window_start <= now()
        AND c.expires_at > now() AND c.auto_renew
        AND d.ssl_provider = 'acme' AND d.verification_status = 'verified') due,
     (SELECT count(*)::int AS n FROM certworker_ledger l
      WHERE l.directory = ANY (COALESCE($1::text[], (SELECT array_agg(DISTINCT directory) FROM certworker_acme_accounts)))
        AND l.at > now() - make_interval(secs => $2) AND l.renewal AND l.outcome = 'issued') done`

// queryRower is a connection, pool or transaction.
type queryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func readReplaceProgress(ctx context.Context, db queryRower, directories []string) (ReplaceProgress, error) {
	var p ReplaceProgress
	if err := db.QueryRow(ctx, replaceProgressSQL, directories, ReplacePaceWindow.Seconds()).
		Scan(&p.At, &p.Due, &p.EarliestExpiry, &p.Replaced); err != nil {
		return p, fmt.Errorf("read the progress of replacements: %w", err)
	}
	switch {
	case p.Due == 0:
		at := p.At
		p.DoneBy = &at
	case p.Replaced > 0:
		at := p.At.Add(time.Duration(float64(ReplacePaceWindow) * float64(p.Due) / float64(p.Replaced)))
		p.DoneBy = &at
	}
	return p, nil
}

// ReplaceProgress reads how the replacement of the certificates whose window has
// started is going, at the pace of the CA at directory ("" for every CA the fleet
// has an account with).
func (q *Queue) ReplaceProgress(ctx context.Context, directory string) (ReplaceProgress, error) {
	var dirs []string
	if directory != "" {
		dirs = []string{directory}
	}
	return readReplaceProgress(ctx, q.db, dirs)
}
