package pgtest

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Tenant inserts a tenant to hang domains off and returns its id.
func Tenant(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	var id string
	if err := pool.QueryRow(context.Background(),
		`INSERT INTO proxy_tenants (name, slug, email) VALUES ('test tenant', $1, 'tenant@certworker.invalid') RETURNING id::text`,
		"t-"+uuid.NewString()).Scan(&id); err != nil {
		t.Fatalf("insert tenant: %v", err)
	}
	return id
}

// Domain inserts a verified, pending ACME domain called name for tenant (claimable at
// once, as after the tenant's "verify") and returns its id.
func Domain(t testing.TB, pool *pgxpool.Pool, tenant, name string) string {
	t.Helper()
	var id string
	if err := pool.QueryRow(context.Background(), `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
VALUES ($1, $2, 'verified', 'tok', 'pending', 'acme') RETURNING id::text`, tenant, name).Scan(&id); err != nil {
		t.Fatalf("insert domain %s: %v", name, err)
	}
	return id
}
