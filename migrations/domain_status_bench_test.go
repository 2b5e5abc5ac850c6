package migrations_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
)

// BenchmarkDomainStatusAtAMillion measures certworker_domain_status and
// certworker_domain_events at a million domains, as a proxy calls them (prepared
// statements, their generic plans), on fillServingMillion's database with an event
// for every domain, 20 for each domain asked about, the fleet's settings recorded and
// a pause of another registered domain in force: the server's execution time of each
// call and its round trip from this client, median and p99 of 2,000 domains of each
// kind. It writes bench/domain-status.txt.
func BenchmarkDomainStatusAtAMillion(b *testing.B) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.NewDB(b))
	require.NoError(b, err)
	b.Cleanup(func() { conn.Close(ctx) })
	start := time.Now()
	fillServingMillion(b, conn)
	for _, sql := range []string{
		`INSERT INTO certworker_settings (id, max_attempts, retry_base_seconds, retry_max_seconds, dns_target, dns01_zone)
         VALUES (true, 10, 60, 14400, 'edge.proxy.example', 'acme.proxy.example')`,
		`UPDATE proxy_domains SET ssl_error = 'waiting for DNS: no such name; to be issued, point it at edge.proxy.example (CNAME)'
         WHERE domain LIKE 'd90.%'`,
		`INSERT INTO certworker_dns_state (domain_id, challenge, waiting_since, next_check_at)
         SELECT id, 'http-01', now(), now() + interval '10 seconds' FROM proxy_domains WHERE domain LIKE 'd90.%'`,
		`UPDATE proxy_domains SET ssl_attempts = 2, ssl_last_attempt_at = now(), ssl_error = 'urn:ietf:params:acme:error:connection: timeout'
         WHERE domain LIKE 'd93.%'`,
		`INSERT INTO certworker_pauses (scope, key, source, paused_until, reason)
         VALUES ('registered_domain', 'elsewhere.example', 'rate_limit', now() + interval '1 hour', 'too many certificates')`,
		`INSERT INTO certworker_domain_events (domain_id, tenant_id, event, at, last_at)
         SELECT id, tenant_id, 'claimed', now() - interval '1 day', now() - interval '1 day' FROM proxy_domains`,
		`INSERT INTO certworker_domain_events (domain_id, tenant_id, event, reason, message, at, last_at)
         SELECT d.id, d.tenant_id, CASE WHEN g % 2 = 0 THEN 'claimed' ELSE 'failed' END,
                CASE WHEN g % 2 = 1 THEN 'validation_failed' END, 'urn:ietf:params:acme:error:unauthorized: 404',
                now() - make_interval(mins => 20 - g), now() - make_interval(mins => 20 - g)
         FROM proxy_domains d, generate_series(1, 20) g WHERE d.domain ~ '^d50\.t[0-9]*[16]\.example$'`,
		`VACUUM ANALYZE certworker_domain_events, certworker_dns_state, proxy_domains`,
	} {
		_, err := conn.Exec(ctx, sql)
		require.NoError(b, err, sql)
	}
	b.Logf("filled in %s", time.Since(start).Round(time.Second))
	var events int
	require.NoError(b, conn.QueryRow(ctx, `SELECT count(*) FROM certworker_domain_events`).Scan(&events))

	const statusSQL = `SELECT domain_id, domain, state, reason, message, next_check_at, point_to, cname_target, challenge,
    expires_at, renew_at FROM certworker_domain_status($1, $2)`
	const eventsSQL = `SELECT id, at, event, reason, message, count, last_at FROM certworker_domain_events($1, $2, 20)`
	_, err = conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan;
PREPARE status_of(uuid, uuid) AS `+statusSQL+`; PREPARE events_of(uuid, uuid) AS `+eventsSQL)
	require.NoError(b, err)
	const each = 2000 // the header says "2,000"
	kinds := []struct {
		what, prefix, stmt, sql string
		other                   bool   // ask as another tenant
		want                    string // the state, or "" for no row; for events, the rows
	}{
		{"status: issued", "d50", "status_of", statusSQL, false, "issued"},
		{"status: waiting_for_dns", "d90", "status_of", statusSQL, false, "waiting_for_dns"},
		{"status: queued, retrying", "d93", "status_of", statusSQL, false, "queued"},
		{"status: not_managed (unverified)", "d97", "status_of", statusSQL, false, "not_managed"},
		{"status: a case twin", "D1", "status_of", statusSQL, false, "queued"},
		{"status: another tenant's domain", "d50", "status_of", statusSQL, true, ""},
		{"events: 20 newest of 21", "d50", "events_of", eventsSQL, false, "20"},
	}
	type result struct {
		what       string
		exec, trip []time.Duration
	}
	var results []result
	for b.Loop() {
		results = results[:0]
		for _, k := range kinds {
			r := result{what: k.what}
			for i := range each {
				n := 1 + 5*i
				var id, tenant string
				require.NoError(b, conn.QueryRow(ctx, `SELECT id::text, tenant_id::text FROM proxy_domains WHERE domain = $1`,
					fmt.Sprintf("%s.t%d.example", k.prefix, n)).Scan(&id, &tenant))
				if k.other {
					require.NoError(b, conn.QueryRow(ctx, `SELECT id::text FROM proxy_tenants WHERE slug = $1`,
						fmt.Sprintf("t%d", n+1)).Scan(&tenant))
				}
				var plan string
				require.NoError(b, conn.QueryRow(ctx, `EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) EXECUTE `+k.stmt+`('`+id+`', '`+tenant+`')`,
					pgx.QueryExecModeSimpleProtocol).Scan(&plan))
				var explained []struct {
					ExecutionTime float64 `json:"Execution Time"`
				}
				require.NoError(b, json.Unmarshal([]byte(plan), &explained))
				r.exec = append(r.exec, time.Duration(explained[0].ExecutionTime*float64(time.Millisecond)))

				t0 := time.Now()
				rows, err := conn.Query(ctx, k.sql, id, tenant)
				require.NoError(b, err)
				got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
					vals, err := row.Values()
					if err != nil || k.stmt != "status_of" {
						return "", err
					}
					return vals[2].(string), nil
				})
				r.trip = append(r.trip, time.Since(t0))
				require.NoError(b, err)
				switch {
				case k.want == "":
					require.Empty(b, got, k.what)
				case k.stmt == "events_of":
					require.Len(b, got, 20, k.what)
				default:
					require.Equal(b, []string{k.want}, got, k.what)
				}
			}
			results = append(results, r)
		}
	}

	pct := func(d []time.Duration, p int) string {
		s := slices.Clone(d)
		slices.Sort(s)
		return fmt.Sprintf("%.3f ms", float64(s[(len(s)-1)*p/100])/float64(time.Millisecond))
	}
	var text strings.Builder
	fmt.Fprintf(&text, `# certworker_domain_status and certworker_domain_events at a million domains
# (migrations/domain_status_bench_test.go): certificate-for.txt's 1,002,000 domains of
# 10,000 tenants, %d events (one for every domain, 21 for each d50 asked), the fleet's
# settings recorded, DNS waits for the d90s and a pause in force; %s domains of each
# kind, each of another tenant, asked once each on one session in the generic plan
# (force_generic_plan). "exec" is the server's Execution Time of EXPLAIN (ANALYZE,
# TIMING OFF) EXECUTE of the prepared statement; "round trip" is this client's time for
# the statement a proxy sends (prepared once by pgx), over loopback, rows read.
# %s, %s %s/%s, %d CPUs, load average %s when written, PostgreSQL image %s
# command: CERTWORKER_PG_IMAGE=%s go test -run '^$' -bench BenchmarkDomainStatusAtAMillion -benchtime 1x -timeout 60m ./migrations/

%-36s %12s %12s %14s %14s
`, events, "2,000", time.Now().UTC().Format("2006-01-02T15:04Z"), runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), loadAverage(), pgtest.Image(), pgtest.Image(),
		"call", "exec p50", "exec p99", "round trip p50", "round trip p99")
	for _, r := range results {
		fmt.Fprintf(&text, "%-36s %12s %12s %14s %14s\n", r.what, pct(r.exec, 50), pct(r.exec, 99), pct(r.trip, 50), pct(r.trip, 99))
	}
	b.Log("\n" + text.String())
	require.NoError(b, os.WriteFile(filepath.Join("..", "bench", "domain-status.txt"), []byte(text.String()), 0o644))
}
