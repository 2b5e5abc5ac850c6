package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

const fleetTestDirectory = "https://ca.example/dir"

func fleetDomains(t *testing.T, pool *pgxpool.Pool, prefix string, n int, status string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
WITH t AS (INSERT INTO proxy_tenants (name, slug, email) VALUES ('t', $1, 't@example.com') RETURNING id)
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider, ssl_attempts, ssl_expires_at)
SELECT t.id, $1 || g || '.example', 'verified', 'tok', $3, 'acme', CASE WHEN $3 = 'failed' THEN 10 ELSE 0 END,
       CASE WHEN $3 = 'active' THEN now() + interval '60 days' END
FROM t, generate_series(1, $2::int) g`, prefix, n, status)
	require.NoError(t, err)
}

// metricValue reads one series of the collector's output, by its text form.
func metricValue(t *testing.T, c prometheus.Collector, name string, labels string) (float64, bool) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var got []string
			for _, lp := range m.GetLabel() {
				got = append(got, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
			}
			if strings.Join(got, ",") == labels {
				if m.GetCounter() != nil {
					return m.GetCounter().GetValue(), true
				}
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

func waitMetric(t *testing.T, c prometheus.Collector, name, labels string, want float64) {
	t.Helper()
	require.Eventually(t, func() bool {
		v, ok := metricValue(t, c, name, labels)
		return ok && v == want
	}, 15*time.Second, 20*time.Millisecond, "%s{%s} never became %v", name, labels, want)
}

// The collector reads on its timer and a scrape reports the last values: a scrape
// while the database is gone still answers, from memory, and the failed read is
// counted. Guards against the depth query that used to run on every scrape.
func TestFleet_RefreshesOnTimerAndScrapesFromMemory(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	fleetDomains(t, pool, "failed", 2, "failed")
	fleetDomains(t, pool, "active", 5, "active")
	f := newFleet(queue.New(pool, issuing.DefaultConfig()), fleetTestDirectory, "test", 50*time.Millisecond, zap.NewNop())
	f.Stop() // safe before Start
	f.Start(context.Background())
	t.Cleanup(f.Stop)

	waitMetric(t, f, "certworker_queue_domains", `status="failed"`, 2)
	waitMetric(t, f, "certworker_domains_verified", "", 7)
	waitMetric(t, f, "certworker_domains_valid_certificate", "", 5)
	v, ok := metricValue(t, f, "certworker_certificate_slo_ratio", "")
	require.True(t, ok)
	require.InDelta(t, 5.0/7, v, 1e-9)
	for _, w := range []string{"7d", "3d", "1d"} {
		v, ok := metricValue(t, f, "certworker_certificates_expiring_unrenewed", `within="`+w+`"`)
		require.True(t, ok, w)
		require.Zero(t, v, w)
	}

	// The timer, not a scrape, picks up a change.
	fleetDomains(t, pool, "failed-later", 1, "failed")
	waitMetric(t, f, "certworker_queue_domains", `status="failed"`, 3)

	// The database goes away: scrapes still answer from memory. Each read fails from
	// then on, one every 50 ms, so the count is at least one by the time it is seen
	// (a busy machine can look only once it is past one).
	pool.Close()
	require.Eventually(t, func() bool {
		v, ok := metricValue(t, f, "certworker_fleet_stats_failures_total", "")
		return ok && v >= 1
	}, 15*time.Second, 20*time.Millisecond, "no failed read counted")
	v, ok = metricValue(t, f, "certworker_queue_domains", `status="failed"`)
	require.True(t, ok, "the last values are still reported")
	require.Equal(t, 3.0, v)
	f.Stop()
	f.Stop() // safe twice
}

// The number of series does not grow with the domains: the same at 3 domains as at
// 300, in every state.
func TestFleet_CardinalityDoesNotGrowWithDomains(t *testing.T) {
	t.Parallel()
	count := func(n int) int {
		pool, _ := pgtest.NewPool(t)
		for _, status := range []string{"pending", "active", "failed"} {
			fleetDomains(t, pool, status, n, status)
		}
		_, err := pool.Exec(context.Background(), `
INSERT INTO certworker_settings (id, limits) VALUES (true, '{"orders_per_account": {"count": 300, "window_seconds": 10800}}')
ON CONFLICT (id) DO UPDATE SET limits = EXCLUDED.limits`)
		require.NoError(t, err)
		f := newFleet(queue.New(pool, issuing.DefaultConfig()), fleetTestDirectory, "test", time.Hour, zap.NewNop())
		f.refresh(context.Background())
		v, ok := metricValue(t, f, "certworker_ledger_account_orders_limit", "")
		require.True(t, ok)
		require.Equal(t, 300.0, v)
		return testutil.CollectAndCount(f)
	}
	small, large := count(1), count(100)
	require.Equal(t, small, large)
	// queue 4 + expiring 3 + oldest, verified, valid, slo, pending + paused 3 + ca +
	// ledger 2 + replace now, replaced recently, done by (the earliest expiry among
	// those to replace is absent: none) + when the totals were counted + the
	// collector's own 3.
	require.Equal(t, 25, small)
}

// A mass revocation shows in the metrics (issue #18): the certificates whose window
// has started and are not replaced, the earliest expiry among them, and when they are
// done at the current pace: +Inf with no replacement lately, which the alert
// CertworkerReplacementTooSlow compares with that expiry.
func TestFleet_ReportsTheCertificatesToReplaceNow(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	fleetDomains(t, pool, "drill", 3, "active")
	_, err := pool.Exec(context.Background(), `
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at, ari_window_start, ari_window_end)
SELECT domain, 'pem', 'key', now() + interval '5 days', now() - interval '1 minute', now() + interval '1 day'
FROM proxy_domains WHERE domain LIKE 'drill%'`)
	require.NoError(t, err)
	f := newFleet(queue.New(pool, issuing.DefaultConfig()), fleetTestDirectory, "test", time.Hour, zap.NewNop())
	f.refresh(context.Background())
	v, ok := metricValue(t, f, "certworker_certificates_replace_now", "")
	require.True(t, ok)
	require.Equal(t, 3.0, v)
	v, ok = metricValue(t, f, "certworker_certificates_replace_now_done_by_timestamp_seconds", "")
	require.True(t, ok)
	require.True(t, math.IsInf(v, 1), "none replaced lately: never, got %v", v)
	v, ok = metricValue(t, f, "certworker_certificates_replace_now_earliest_expiry_timestamp_seconds", "")
	require.True(t, ok)
	require.InDelta(t, float64(time.Now().Add(5*24*time.Hour).Unix()), v, 120)
}

// status's line on a mass replacement.
func TestReplaceLine_SaysHowManyAndWhenDone(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	done, expiry := at.Add(2*time.Hour), at.Add(time.Hour)
	require.Equal(t, "replace now: 0, at the current pace done by 2026-12-01T12:00:00Z",
		replaceLine(issuing.ReplaceProgress{At: at, DoneBy: &at}))
	require.Equal(t, "replace now: 40, at the current pace done by 2026-12-01T14:00:00Z (5 replaced in the last 15m0s; "+
		"the first expires 2026-12-01T13:00:00Z); LATE: certificates expire before they are replaced",
		replaceLine(issuing.ReplaceProgress{At: at, Due: 40, Replaced: 5, DoneBy: &done, EarliestExpiry: &expiry}))
	require.Equal(t, "replace now: 40, at the current pace done by never (none replaced in the last 15m0s; "+
		"the first expires 2026-12-01T13:00:00Z); LATE: certificates expire before they are replaced",
		replaceLine(issuing.ReplaceProgress{At: at, Due: 40, EarliestExpiry: &expiry}))
}

// The fleet statistics are read by one instance, the holder of the duty: a second
// instance's read reports none of the figures (the holder's stand for the fleet, and
// alert rules take the max), and looks again no later than its interval; once the
// holder's lease has run out, the second takes the duty over and reads them. Guards
// against every instance of a fleet reading the same statistics (160 ms at a million
// domains, once a minute each), and against figures that die with their reader.
func TestFleet_OneInstanceReadsTheStatisticsAndAnotherTakesOver(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	fleetDomains(t, pool, "duty", 2, "pending")
	q := queue.New(pool, issuing.DefaultConfig())
	first := newFleet(q, fleetTestDirectory, "first", time.Minute, zap.NewNop())
	second := newFleet(q, fleetTestDirectory, "second", time.Minute, zap.NewNop())
	require.Equal(t, time.Minute, first.refresh(context.Background()))
	_, ok := metricValue(t, first, "certworker_domains_verified", "")
	require.True(t, ok, "the holder reports the figures")
	require.LessOrEqual(t, second.refresh(context.Background()), time.Minute)
	_, ok = metricValue(t, second, "certworker_domains_verified", "")
	require.False(t, ok, "a second instance read the statistics the first holds the duty for")

	_, err := pool.Exec(context.Background(), `UPDATE certworker_fleet_duties SET expires_at = now() WHERE holder = 'first'`)
	require.NoError(t, err)
	second.refresh(context.Background())
	v, ok := metricValue(t, second, "certworker_domains_verified", "")
	require.True(t, ok, "the second took the duty over")
	require.Equal(t, 2.0, v)
	first.refresh(context.Background())
	_, ok = metricValue(t, first, "certworker_domains_verified", "")
	require.False(t, ok, "the old holder dropped its figures")
}
