package pgtest

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
)

// PlanNode is a node of a plan: its type and, for a scan, the relation and index.
type PlanNode struct {
	NodeType     string `json:"Node Type"`
	RelationName string `json:"Relation Name"`
	IndexName    string `json:"Index Name"`
}

// querier is a connection, a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// PlanNodes is every node of the plan EXPLAIN (FORMAT JSON) gives for sql, subplans
// included, depth first: what a test asserts a statement reads through.
func PlanNodes(tb testing.TB, q querier, sql string, args ...any) []PlanNode {
	tb.Helper()
	var out string
	if err := q.QueryRow(context.Background(), "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&out); err != nil {
		tb.Fatalf("explain: %v\n%s", err, sql)
	}
	type node struct {
		PlanNode
		Plans []node `json:"Plans"`
	}
	var plans []struct {
		Plan node `json:"Plan"`
	}
	if err := json.Unmarshal([]byte(out), &plans); err != nil || len(plans) != 1 {
		tb.Fatalf("explain: %d plans, %v:\n%s", len(plans), err, out)
	}
	var nodes []PlanNode
	var walk func(n node)
	walk = func(n node) {
		nodes = append(nodes, n.PlanNode)
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(plans[0].Plan)
	return nodes
}
