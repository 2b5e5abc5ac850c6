package deploy_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// metricDef is a metric certworker registers: whether it is a histogram (which
// exports _bucket, _sum and _count) and its label names.
type metricDef struct {
	histogram bool
	labels    map[string]bool
}

// exportedMetrics reads the metrics certworker's code registers from its source:
// every prometheus.New{Counter,Gauge,Histogram,Summary}[Vec|Func] whose options name
// it (Name: "...", ConstLabels' keys, a Vec's label list) and every prometheus.NewDesc
// (a collector's, such as the fleet statistics'). The source and not a scrape of a
// running instance: a Vec that has seen no label value yet exports nothing, so a
// scrape misses the metrics a dashboard most needs on the day something happens.
func exportedMetrics(t *testing.T) map[string]metricDef {
	t.Helper()
	out := map[string]metricDef{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(docsRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != docsRoot {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // a module of its own: not certworker's binary
				}
			}
			if name := d.Name(); name == ".git" || name == "testdata" || name == "bin" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "prometheus" {
				return true
			}
			switch {
			case sel.Sel.Name == "NewDesc":
				if name, ok := stringLit(call.Args[0]); ok {
					def := metricDef{labels: map[string]bool{}}
					if len(call.Args) > 2 {
						for _, l := range stringList(call.Args[2]) {
							def.labels[l] = true
						}
					}
					out[name] = def
				}
			case strings.HasPrefix(sel.Sel.Name, "New"):
				opts, ok := call.Args[0].(*ast.CompositeLit)
				if !ok {
					return true
				}
				def := metricDef{histogram: strings.HasPrefix(sel.Sel.Name, "NewHistogram"), labels: map[string]bool{}}
				var name string
				for _, e := range opts.Elts {
					kv, ok := e.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					switch key, _ := kv.Key.(*ast.Ident); {
					case key == nil:
					case key.Name == "Name":
						name, _ = stringLit(kv.Value)
					case key.Name == "ConstLabels":
						if labels, ok := kv.Value.(*ast.CompositeLit); ok {
							for _, le := range labels.Elts {
								if lkv, ok := le.(*ast.KeyValueExpr); ok {
									if l, ok := stringLit(lkv.Key); ok {
										def.labels[l] = true
									}
								}
							}
						}
					}
				}
				if strings.HasSuffix(sel.Sel.Name, "Vec") && len(call.Args) > 1 {
					for _, l := range stringList(call.Args[1]) {
						def.labels[l] = true
					}
				}
				if name != "" {
					out[name] = def
				}
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	return out
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// stringList is the literal strings of []string{"a", "b"}.
func stringList(e ast.Expr) []string {
	lit, ok := e.(*ast.CompositeLit)
	if !ok {
		return nil
	}
	var out []string
	for _, el := range lit.Elts {
		if s, ok := stringLit(el); ok {
			out = append(out, s)
		}
	}
	return out
}

// The reading of the source finds what the binary registers: a metric of each kind
// of registration (a Vec, a plain Opts, a histogram, a collector's NewDesc, const
// labels). Guards against a reading that finds nothing, against which every
// dashboard would pass.
func TestDashboard_MetricsAreReadFromTheCode(t *testing.T) {
	t.Parallel()
	m := exportedMetrics(t)
	require.GreaterOrEqual(t, len(m), 40)
	require.Equal(t, metricDef{labels: map[string]bool{"outcome": true}}, m["certworker_issuance_total"])
	require.Equal(t, metricDef{histogram: true, labels: map[string]bool{}}, m["certworker_wake_latency_seconds"])
	require.Equal(t, metricDef{labels: map[string]bool{"within": true}}, m["certworker_certificates_expiring_unrenewed"])
	require.Equal(t, metricDef{labels: map[string]bool{"version": true, "commit": true, "go_version": true}}, m["certworker_build_info"])
	require.Equal(t, metricDef{labels: map[string]bool{}}, m["certworker_listener_connected"])
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
						if b, cut := strings.CutSuffix(name, suffix); cut && exported[b].histogram {
							def, ok, base = exported[b], true, b
							if suffix == "_bucket" {
								labels["le"] = true
							}
						}
					}
				}
				require.True(t, ok, "panel %q queries %s, which certworker does not export", p.Title, name)
				queried[base] = true
				for l := range def.labels {
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
