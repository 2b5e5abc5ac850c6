package migrations_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkNameSeenAtAMillion measures certworker_name_seen at a million domains
// (fillServingMillion, with the 50,000 verified names without a certificate waiting
// for their DNS, and a waiting state row for every domain, as certworker records the
// challenge of each), as a proxy calls it on a handshake that finds no certificate:
// the server's execution time of each call (EXPLAIN ANALYZE's, without per-node
// timing) and the call's round trip from this client over loopback, median and p99
// of 2,000 names of each kind. It writes bench/name-seen.txt.
func BenchmarkNameSeenAtAMillion(b *testing.B) {
	ctx := context.Background()
	conn := servingMillionDB(b)
	start := time.Now()
	for _, sql := range []string{
		`INSERT INTO certworker_dns_state (domain_id, challenge, challenge_at) SELECT id, 'http-01', now() FROM proxy_domains`,
		`UPDATE proxy_domains SET ssl_held = 'dns'
         WHERE verification_status = 'verified' AND ssl_status = 'pending' AND domain ~ '^d9[0-4]\.'`,
		`UPDATE certworker_dns_state s SET waiting_since = now() - interval '2 days', paced_since = now() - interval '2 days',
             next_check_at = now() + interval '1 hour'
         FROM proxy_domains d WHERE d.id = s.domain_id AND d.ssl_held = 'dns'`,
		`VACUUM ANALYZE proxy_domains, certworker_dns_state`,
	} {
		_, err := conn.Exec(ctx, sql)
		require.NoError(b, err, sql)
	}
	b.Logf("waits filled in %s", time.Since(start).Round(time.Second))
	var waiting int
	require.NoError(b, conn.QueryRow(ctx, `SELECT count(*) FROM certworker_dns_state WHERE next_check_at IS NOT NULL`).Scan(&waiting))
	require.Equal(b, 50_000, waiting)

	const seenSQL = `SELECT certworker_name_seen($1)`
	_, err := conn.Exec(ctx, `PREPARE seen(text) AS `+seenSQL)
	require.NoError(b, err)
	// Tenants t1, t6, t11...: each kind's 2,000 names are of different tenants. The
	// call timed by EXPLAIN ANALYZE and the round trip ask two names of the same
	// kind (the first call writes what the second would).
	kinds := []struct {
		what              string
		exec, trip, prime func(tenant int) string // prime: asked first, untimed
		want              bool
	}{
		{what: "a waiting name, first handshake (writes)", exec: func(n int) string { return fmt.Sprintf("d90.t%d.example", n) },
			trip: func(n int) string { return fmt.Sprintf("d91.t%d.example", n) }, want: true},
		{what: "the same, in upper case with a trailing dot", exec: func(n int) string { return fmt.Sprintf("D92.T%d.Example.", n) },
			trip: func(n int) string { return fmt.Sprintf("D93.T%d.Example.", n) }, want: true},
		{what: "a waiting name seen in the last 10 s", prime: func(n int) string { return fmt.Sprintf("d94.t%d.example", n) },
			exec: func(n int) string { return fmt.Sprintf("d94.t%d.example", n) },
			trip: func(n int) string { return fmt.Sprintf("d94.t%d.example", n) }},
		{what: "a name with a certificate, not waiting", exec: func(n int) string { return fmt.Sprintf("d50.t%d.example", n) },
			trip: func(n int) string { return fmt.Sprintf("d51.t%d.example", n) }},
		{what: "an unverified name", exec: func(n int) string { return fmt.Sprintf("d97.t%d.example", n) },
			trip: func(n int) string { return fmt.Sprintf("d98.t%d.example", n) }},
		{what: "a name nobody has", exec: func(n int) string { return fmt.Sprintf("a.b.t%d.example", n) },
			trip: func(n int) string { return fmt.Sprintf("c.d.t%d.example", n) }},
	}
	results := measureKinds(b, len(kinds), func(kind, tenant int) (time.Duration, time.Duration) {
		k := kinds[kind]
		if k.prime != nil {
			var primed bool
			require.NoError(b, conn.QueryRow(ctx, seenSQL, k.prime(tenant)).Scan(&primed))
			require.True(b, primed, k.prime(tenant))
		}
		exec, _ := explainExecute(b, conn, `seen('`+k.exec(tenant)+`')`)
		t0 := time.Now()
		var got bool
		require.NoError(b, conn.QueryRow(ctx, seenSQL, k.trip(tenant)).Scan(&got)) // prepared once by pgx
		trip := time.Since(t0)
		require.Equal(b, k.want, got, k.trip(tenant))
		return exec, trip
	})
	for i := range results {
		results[i].what = kinds[i].what
	}

	writeBenchTable(b, "name-seen.txt", fmt.Sprintf(`# certworker_name_seen at a million domains (migrations/name_seen_bench_test.go):
# 1,002,000 domains of 10,000 tenants as in bench/certificate-for.txt (a wildcard each,
# 89 names with a certificate, 5 verified waiting for their DNS, 5 unverified), a
# waiting state row for every domain (50,000 of them waiting, checked next in an hour),
# %s names of each kind, each of another tenant, asked once each on one session.
# "exec" is the server's Execution Time of EXPLAIN (ANALYZE, TIMING OFF) EXECUTE of
# the prepared statement; "round trip" is this client's time for the statement a
# proxy sends (prepared once by pgx), over loopback, each call its own transaction.
`, "2,000"), "BenchmarkNameSeenAtAMillion", results)
}
