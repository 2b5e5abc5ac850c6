// Package metricsource reads the Prometheus metrics certworker registers from its Go
// source, for the tests that hold the dashboard and docs/reference.md against them.
package metricsource

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Def is a metric certworker registers: whether it is a histogram (which exports
// _bucket, _sum and _count) and its label names.
type Def struct {
	Histogram bool
	Labels    map[string]bool
}

// Read reads the metrics certworker's code registers from its source under root (the repository's top directory):
// every prometheus.New{Counter,Gauge,Histogram,Summary}[Vec|Func] whose options name
// it (Name: "...", ConstLabels' keys, a Vec's label list) and every prometheus.NewDesc
// (a collector's, such as the fleet statistics'). The source and not a scrape of a
// running instance: a Vec that has seen no label value yet exports nothing, so a
// scrape misses the metrics a dashboard most needs on the day something happens.
func Read(root string) (map[string]Def, error) {
	out := map[string]Def{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root {
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
					def := Def{Labels: map[string]bool{}}
					if len(call.Args) > 2 {
						for _, l := range stringList(call.Args[2]) {
							def.Labels[l] = true
						}
					}
					out[name] = def
				}
			case strings.HasPrefix(sel.Sel.Name, "New"):
				opts, ok := call.Args[0].(*ast.CompositeLit)
				if !ok {
					return true
				}
				def := Def{Histogram: strings.HasPrefix(sel.Sel.Name, "NewHistogram"), Labels: map[string]bool{}}
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
										def.Labels[l] = true
									}
								}
							}
						}
					}
				}
				if strings.HasSuffix(sel.Sel.Name, "Vec") && len(call.Args) > 1 {
					for _, l := range stringList(call.Args[1]) {
						def.Labels[l] = true
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
	if err != nil {
		return nil, err
	}
	return out, nil
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
