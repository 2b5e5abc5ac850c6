package queue_test

// BenchmarkLedgerImport: one tenant verifies 1,000 names at once under the account's
// order limit, and the ledger paces their orders; when is the last one sent, against
// the CA's own pace? Written to bench/ledger-import.txt.

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

const (
	importNames = 1000
	// importScale divides the default limit's DURATION: 300/3h becomes 300/15s, a
	// token every 50 ms instead of every 36 s, so that the run takes about a minute.
	// The ledger reads the database's clock, which a benchmark cannot move.
	importScale = 720
	// importSlots is how many domains one claim takes (a worker's free slots).
	importSlots = 16
)

// importDrain runs the import under limits: claims importSlots at a time, asks the
// ledger, and when nothing goes waits for NextDue, as the worker's timer does. The
// fake CA issues every order at once (no token is given back). It returns the time of
// the last order after the first, from the ledger's rows (the database's clock).
func importDrain(b *testing.B, limits issuing.Limits) time.Duration {
	ctx := context.Background()
	pool, _ := pgtest.NewPool(b)
	q := queue.New(pool, issuing.DefaultConfig())
	tenant := pgtest.Tenant(b, pool)
	if _, err := pool.Exec(ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
SELECT $1, 'n' || g || '.import' || g || '.example', 'verified', 'tok', 'pending', 'acme'
FROM generate_series(1, $2::int) g`, tenant, importNames); err != nil {
		b.Fatal(err)
	}
	for sent := 0; sent < importNames; {
		claims, err := q.Claim(ctx, "bench", testDirectory, importSlots)
		if err != nil {
			b.Fatal(err)
		}
		var as []queue.Admission
		for _, c := range claims {
			as = append(as, queue.Admission{Claim: c, Name: c.Domain, RegisteredDomain: c.Domain})
		}
		admitted := 0
		if len(as) > 0 {
			got, _, err := q.Admit(ctx, testDirectory, limits, as)
			if err != nil {
				b.Fatal(err)
			}
			admitted = len(got)
		}
		sent += admitted
		if admitted == len(claims) && len(claims) == importSlots {
			continue
		}
		d, ok, err := q.NextDue(ctx, testDirectory)
		if err != nil {
			b.Fatal(err)
		}
		if ok && d > 0 {
			time.Sleep(d)
		}
	}
	var first, last time.Time
	if err := pool.QueryRow(ctx, `SELECT min(at), max(at) FROM certworker_ledger`).Scan(&first, &last); err != nil {
		b.Fatal(err)
	}
	return last.Sub(first)
}

func BenchmarkLedgerImport(b *testing.B) {
	def := issuing.Limit{Count: 300, Window: 3 * time.Hour}
	scaled := issuing.Limit{Count: def.Count, Window: def.Window / importScale}
	var s strings.Builder
	fmt.Fprintf(&s, "# One tenant verifies %d names at once under --limit-orders-per-account %s (Let's Encrypt's:\n", importNames, def)
	fmt.Fprintf(&s, "# a burst of 300, then one every 36 s), alone and under --limit-tenant-reserve 25%% (R = 75).\n")
	fmt.Fprintf(&s, "# The limit is scaled down %dx to %s (one token every %s) and the times scaled back up;\n", importScale, scaled, scaled.Interval())
	fmt.Fprintf(&s, "# the ledger runs on the database's clock. A claim takes %d domains, the ledger is asked,\n", importSlots)
	fmt.Fprintf(&s, "# and when nothing more goes the loop waits for NextDue (the worker's timer); a fake CA\n")
	fmt.Fprintf(&s, "# issues every order. \"last order\" is the last ledger row's time after the first's.\n")
	fmt.Fprintf(&s, "# The ledger of COUNT orders in any window of DURATION sent them in batches of 300 (225\n")
	fmt.Fprintf(&s, "# under the reserve) a window apart: the last at 9 h (12 h).\n")
	fmt.Fprintf(&s, "# %s, %s, %d CPUs, load average %s, PostgreSQL image %s\n", time.Now().UTC().Format(time.RFC3339),
		runtime.Version(), runtime.NumCPU(), loadAvg(), pgtest.Image())
	fmt.Fprintf(&s, "# command: go test -run '^$' -bench BenchmarkLedgerImport -benchtime 1x ./queue/\n\n")
	fmt.Fprintf(&s, "%-22s %12s %14s %12s %8s\n", "case", "last order", "CA's pace", "scaled up", "vs CA")
	for _, tc := range []struct {
		name    string
		reserve float64
	}{
		{"alone, no reserve", 0},
		{"alone, reserve 25%", 0.25},
	} {
		b.Run(strings.ReplaceAll(tc.name, " ", "-"), func(b *testing.B) {
			limits := issuing.Limits{OrdersPerAccount: scaled, TenantReserve: tc.reserve}
			burst := def.Count
			if tc.reserve > 0 {
				burst -= 75
			}
			pace := time.Duration(importNames-burst) * scaled.Interval()
			got := importDrain(b, limits)
			b.ReportMetric(got.Seconds(), "last-s")
			fmt.Fprintf(&s, "%-22s %11.2fs %13.2fs %11.2fh %7.3fx\n", tc.name, got.Seconds(), pace.Seconds(),
				(got * importScale).Hours(), got.Seconds()/pace.Seconds())
		})
	}
	writeBenchFile(b, "ledger-import.txt", s.String())
}
