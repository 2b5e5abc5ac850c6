package worker_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// drillSize is how many certificates the drill replaces, and how many newcomers
// arrive with it.
const drillSize = 1000

// drillOrderTime stands for the CA's time on an order (new order to certificate):
// Pebble without validation sleep takes about this much on this machine
// (bench/issuance.txt's orders, less its 1 to 2 s of validation sleep).
const drillOrderTime = 100 * time.Millisecond

// BenchmarkDrill is a mass revocation at --concurrency 16: 1,000 stored
// certificates whose renewal window (ARI) the CA moved to now, already read (the
// state RecordRenewalInfo leaves: window open, renewal time passed), under an
// exact-set limit of 1 a week that their own issuance spent, and 1,000 newcomers
// verified at the same moment. It measures, in the same run, the time until every
// certificate is replaced and until every newcomer is issued, from the worker's start
// on the database's clock, and writes bench/drill.txt. The issuer is the fake,
// answering after drillOrderTime, so what is measured is the queue, the ledger and
// the worker, not a CA.
func BenchmarkDrill(b *testing.B) {
	d := newBenchDB(b)
	if _, err := d.pool.Exec(d.ctx, `
WITH doms AS (
    INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider,
                               ssl_expires_at)
    SELECT $1, 'drill' || g || '.example', 'verified', 'tok', 'active', 'acme', now() + interval '20 days'
    FROM generate_series(1, $2::int) g
    RETURNING domain
), certs AS (
    INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at, not_before, serial,
                                    renew_at, ari_window_start, ari_window_end, ari_next_at)
    SELECT domain, 'pem', 'key', now() + interval '20 days', now() - interval '70 days', md5(domain),
           now() - interval '1 second', now() - interval '1 minute', now() + interval '1 day', now() + interval '6 hours'
    FROM doms
), issued AS (
    INSERT INTO certworker_issued_names (directory, name) SELECT $3, domain FROM doms
)
INSERT INTO certworker_ledger (directory, name, registered_domain, renewal, outcome, at)
SELECT $3, domain, domain, false, 'issued', now() - interval '1 day' FROM doms`,
		d.tenant, drillSize, workertest.Directory); err != nil {
		b.Fatal(err)
	}
	if _, err := d.pool.Exec(d.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
SELECT $1, 'new' || g || '.example', 'verified', 'tok', 'pending', 'acme' FROM generate_series(1, $2::int) g`,
		d.tenant, drillSize); err != nil {
		b.Fatal(err)
	}
	if _, err := d.pool.Exec(d.ctx, `VACUUM ANALYZE proxy_domains, proxy_certificates, certworker_ledger`); err != nil {
		b.Fatal(err)
	}
	fake := fakeissuer.New(1)
	fake.Delay = drillOrderTime
	limits := issuing.Limits{CertsPerExactSet: issuing.Limit{Count: 1, Window: 7 * 24 * time.Hour}}
	var start time.Time
	if err := d.pool.QueryRow(d.ctx, `SELECT clock_timestamp()`).Scan(&start); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	in := benchWorker(b, d.dsn, fake, worker.Config{Concurrency: 16, PollInterval: time.Second, Limits: limits})
	d.waitActive(b, 2*drillSize, 10*time.Minute, 200*time.Millisecond)
	// Replaced: the stored certificate is the fake's, whose window is unknown.
	for {
		var left int
		if err := d.pool.QueryRow(d.ctx, `
SELECT count(*) FROM proxy_certificates WHERE domain LIKE 'drill%' AND ari_window_start IS NOT NULL`).Scan(&left); err != nil {
			b.Fatal(err)
		}
		if left == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	b.StopTimer()
	var replacedAt, issuedAt time.Time
	var exempt int
	if err := d.pool.QueryRow(d.ctx, `
SELECT (SELECT max(updated_at) FROM proxy_certificates WHERE domain LIKE 'drill%'),
       (SELECT max(updated_at) FROM proxy_certificates WHERE domain LIKE 'new%'),
       (SELECT count(*) FROM certworker_ledger WHERE exempt AND outcome = 'issued')`).Scan(&replacedAt, &issuedAt, &exempt); err != nil {
		b.Fatal(err)
	}
	checkIssuedOnce(b, fake, 2*drillSize)
	if exempt != drillSize {
		b.Fatalf("%d replacements recorded as exempt, want %d", exempt, drillSize)
	}
	replace, issue := replacedAt.Sub(start), issuedAt.Sub(start)
	b.ReportMetric(replace.Seconds(), "replace-s")
	b.ReportMetric(issue.Seconds(), "issue-s")

	var s strings.Builder
	fmt.Fprintf(&s, "# A mass revocation at --concurrency 16 (issue #18): 1,000 certificates whose renewal window the CA\n")
	fmt.Fprintf(&s, "# moved to now (already read: window open, renewal time passed), under an exact-set limit of 1 a week\n")
	fmt.Fprintf(&s, "# their own issuance spent, and 1,000 newcomers verified at the same moment. One run; times from the\n")
	fmt.Fprintf(&s, "# worker's start to the last certificate of each set stored, on the database's clock. Fake issuer\n")
	fmt.Fprintf(&s, "# answering after %s (a CA's order); production JSON logs at info level.\n", drillOrderTime)
	env := benchEnv()
	if os.Getenv("TEST_DATABASE_URL") != "" {
		var version, fsync string
		if err := d.pool.QueryRow(d.ctx, `SELECT current_setting('server_version'), current_setting('fsync')`).Scan(&version, &fsync); err != nil {
			b.Fatal(err)
		}
		env = strings.Replace(env, fmt.Sprintf("PostgreSQL image %s (local container, fsync=off)", pgtest.Image()),
			fmt.Sprintf("PostgreSQL %s at TEST_DATABASE_URL (a server on this host, fsync=%s)", version, fsync), 1)
	}
	fmt.Fprintf(&s, "# %s\n# command: go test -run '^$' -bench BenchmarkDrill -benchtime 1x ./queue/worker/\n\n", env)
	tw := tabwriter.NewWriter(&s, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "set\tcertificates\tseconds\tper second")
	fmt.Fprintf(tw, "replaced (drill, ARI renewals)\t%d\t%.1f\t%.1f\n", drillSize, replace.Seconds(), drillSize/replace.Seconds())
	fmt.Fprintf(tw, "issued (newcomers)\t%d\t%.1f\t%.1f\n", drillSize, issue.Seconds(), drillSize/issue.Seconds())
	_ = tw.Flush()
	fmt.Fprintf(&s, "\nreplace / issue: %.2f; every replacement recorded exempt in the ledger (%d); %s\n",
		replace.Seconds()/issue.Seconds(), exempt, claimSources(b, in))
	writeBenchFile(b, "drill.txt", s.String())
}
