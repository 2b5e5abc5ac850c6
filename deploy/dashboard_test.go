package deploy_test

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/metricsource"
)

// exportedMetrics is the metrics certworker's code registers (metricsource.Read).
func exportedMetrics(t *testing.T) map[string]metricsource.Def {
	t.Helper()
	m, err := metricsource.Read(docsRoot)
	require.NoError(t, err)
	return m
}

// The reading of the source finds what the binary registers: a metric of each kind
// of registration (a Vec, a plain Opts, a histogram, a collector's NewDesc, const
// labels). Guards against a reading that finds nothing, against which every
// dashboard would pass.
func TestDashboard_MetricsAreReadFromTheCode(t *testing.T) {
	t.Parallel()
	m := exportedMetrics(t)
	require.GreaterOrEqual(t, len(m), 40)
	require.Equal(t, metricsource.Def{Labels: map[string]bool{"outcome": true}}, m["certworker_issuance_total"])
	require.Equal(t, metricsource.Def{Histogram: true, Labels: map[string]bool{}}, m["certworker_wake_latency_seconds"])
	require.Equal(t, metricsource.Def{Labels: map[string]bool{"within": true}}, m["certworker_certificates_expiring_unrenewed"])
	require.Equal(t, metricsource.Def{Labels: map[string]bool{"version": true, "commit": true, "go_version": true}}, m["certworker_build_info"])
	require.Equal(t, metricsource.Def{Labels: map[string]bool{}}, m["certworker_listener_connected"])
	require.NotContains(t, m, "certworker_wake_latency_seconds_bucket")
}

type dashboard struct {
	Title  string  `json:"title"`
	Panels []panel `json:"panels"`
}

type panel struct {
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

var (
	// metricName is a metric in a PromQL expression (certworker's are the only ones
	// the dashboard reads).
	metricName = regexp.MustCompile(`\bcertworker_[a-z0-9_]+`)
	// matchers is a selector's label matchers: name{label="v", label!~"v"}.
	matchers = regexp.MustCompile(`\b(certworker_[a-z0-9_]+)\{([^}]*)\}`)
	matcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	// grouping is an aggregation's by (...) or without (...).
	grouping = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
)

// Every metric a panel of deploy/grafana-dashboard.json queries is one certworker
// exports (a histogram's as _bucket, _sum or _count), and every label it selects or
// groups by is one of those metrics' (le for a histogram's buckets). The panels cover
// what an operator watches: the queue, wake latency, orders and failures by reason,
// pauses and the ledger, certificates expiring, DNS-01. Guards against a panel that
// stays empty because its metric or label was renamed or never existed.
func TestDashboard_QueriesOnlyMetricsCertworkerExports(t *testing.T) {
	t.Parallel()
	exported := exportedMetrics(t)
	var d dashboard
	b, err := os.ReadFile("grafana-dashboard.json")
	require.NoError(t, err)
	dec := json.NewDecoder(strings.NewReader(string(b)))
	require.NoError(t, dec.Decode(&d))
	require.Equal(t, "certworker", d.Title)

	queried := map[string]bool{}
	n := 0
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		require.NotEmpty(t, p.Targets, "panel %q queries nothing", p.Title)
		for _, target := range p.Targets {
			expr := target.Expr
			names := metricName.FindAllString(expr, -1)
			require.NotEmpty(t, names, "panel %q: %q reads no certworker metric", p.Title, expr)
			labels := map[string]bool{}
			for _, name := range names {
				def, ok := exported[name]
				base := name
				if !ok {
					for _, suffix := range []string{"_bucket", "_sum", "_count"} {
						if b, cut := strings.CutSuffix(name, suffix); cut && exported[b].Histogram {
							def, ok, base = exported[b], true, b
							if suffix == "_bucket" {
								labels["le"] = true
							}
						}
					}
				}
				require.True(t, ok, "panel %q queries %s, which certworker does not export", p.Title, name)
				queried[base] = true
				for l := range def.Labels {
					labels[l] = true
				}
			}
			for _, m := range matchers.FindAllStringSubmatch(expr, -1) {
				for _, l := range matcher.FindAllStringSubmatch(m[2], -1) {
					require.True(t, labels[l[1]], "panel %q: %s has no label %s", p.Title, m[1], l[1])
				}
			}
			for _, g := range grouping.FindAllStringSubmatch(expr, -1) {
				for _, l := range strings.Split(g[1], ",") {
					if l = strings.TrimSpace(l); l != "" {
						require.True(t, labels[l], "panel %q groups by %s, a label of none of %v", p.Title, l, names)
					}
				}
			}
			n++
		}
	}
	require.GreaterOrEqual(t, n, 20)
	for _, want := range []string{
		"certworker_queue_domains",                   // the queue
		"certworker_wake_latency_seconds",            // wake latency
		"certworker_issuance_total",                  // orders and failures by reason
		"certworker_paused_domains",                  // pauses
		"certworker_ledger_account_orders",           // the ledger
		"certworker_certificates_expiring_unrenewed", // certificates expiring
		"certworker_dns01_queries_total",             // DNS-01 queries
	} {
		require.True(t, queried[want], "no panel reads %s", want)
	}
	var unused []string
	for name := range exported {
		if !queried[name] {
			unused = append(unused, name)
		}
	}
	slices.Sort(unused)
	t.Logf("metrics no panel reads: %v", unused)
}
