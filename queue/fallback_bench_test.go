package queue_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// BenchmarkClaimRouted compares the claim of a fleet with one CA with the claim that
// routes between two, on 10,000 due domains of 100 tenants: ns/op is one claim of 10
// rows. "no_pause": nothing holds a domain back, the routing's own cost; "tenth_held":
// a rate limit of the first CA holds back a tenth of the domains (their registered
// domains), for less than --acme-fallback-after, so both claims pass over them on
// every claim.
//
//	CERTWORKER_PG_IMAGE=certworker-postgres:15 go test -run '^$' -bench BenchmarkClaimRouted -benchtime 200x ./queue/
func BenchmarkClaimRouted(b *testing.B) {
	for _, held := range []bool{false, true} {
		for _, tc := range []struct {
			name     string
			fallback *issuing.Fallback
		}{
			{"one_CA", nil},
			{"two_CAs", &issuing.Fallback{Directory: secondDirectory, After: time.Hour}},
		} {
			name := "no_pause/" + tc.name
			if held {
				name = "tenth_held/" + tc.name
			}
			b.Run(name, func(b *testing.B) { benchClaim(b, held, tc.fallback) })
		}
	}
}

func benchClaim(b *testing.B, held bool, fb *issuing.Fallback) {
	ctx := context.Background()
	pool, _ := pgtest.NewPool(b)
	for i := range 100 {
		tn := pgtest.Tenant(b, pool)
		if _, err := pool.Exec(ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
SELECT $1, 'd' || g || '.t' || $2 || CASE WHEN g % 10 = 0 THEN '.held' ELSE '' END || '.example', 'verified', 'tok', 'pending', 'acme'
FROM generate_series(1, 100) g`, tn, strconv.Itoa(i)); err != nil {
			b.Fatal(err)
		}
	}
	q := queue.New(pool, issuing.DefaultConfig())
	for i := range 100 {
		if !held {
			break
		}
		if _, err := q.PauseAt(ctx, testDirectory, issuing.ScopeRegisteredDomain, "t"+strconv.Itoa(i)+".held.example",
			issuing.PauseRateLimit, time.Hour, "bench"); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `ANALYZE`); err != nil {
		b.Fatal(err)
	}
	cfg := issuing.DefaultConfig()
	cfg.Fallback = fb
	q = queue.New(pool, cfg)
	b.ResetTimer()
	for range b.N {
		claims, err := q.Claim(ctx, "bench", testDirectory, 10)
		if err != nil {
			b.Fatal(err)
		}
		if len(claims) < 10 {
			b.Fatalf("the queue ran dry: run it with -benchtime %dx at most", 9000/10)
		}
	}
}
