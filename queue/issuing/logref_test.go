package issuing

import (
	"context"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// A line about a domain names its row and its tenant, also from a step given only
// the name: LogDomainCtx takes them from the context the worker set.
func TestLogDomainCtx_NamesTheRowAndTheTenantTheContextCarries(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	ctx := WithDomainRef(context.Background(), DomainRef{ID: "d-1", TenantID: "t-1"})
	log.Info("with ref", LogDomainCtx(ctx, "shop.example"))
	log.Info("without ref", LogDomainCtx(context.Background(), "shop.example"))

	all := logs.All()
	if len(all) != 2 {
		t.Fatalf("%d lines, want 2", len(all))
	}
	want := map[string]any{"domain": "shop.example", "domain_id": "d-1", "tenant_id": "t-1"}
	for k, v := range want {
		if got := all[0].ContextMap()[k]; got != v {
			t.Errorf("%s = %v, want %v", k, got, v)
		}
	}
	// Without a ref the keys are there, empty: a reader filtering on tenant_id sees
	// the line is about no known row rather than missing it.
	for _, k := range []string{"domain_id", "tenant_id"} {
		if got, ok := all[1].ContextMap()[k]; !ok || got != "" {
			t.Errorf("without a ref: %s = %v (present %v), want present and empty", k, got, ok)
		}
	}
}
