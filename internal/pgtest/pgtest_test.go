package pgtest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/certworker/certworker/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The test bed itself: a fresh database has the schema, and two tests' databases do
// not see each other's rows (the isolation every parallel queue test relies on).
func TestNewDB_IsMigratedAndIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := pgtest.NewDB(t), pgtest.NewDB(t)
	ca, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close(ctx)
	cb, err := pgx.Connect(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close(ctx)
	if _, err := ca.Exec(ctx, "INSERT INTO proxy_tenants (name, slug, email) VALUES ('a', 'a', 'a@example.com')"); err != nil {
		t.Fatalf("schema missing in a fresh database: %v", err)
	}
	var n int
	if err := cb.QueryRow(ctx, "SELECT count(*) FROM proxy_tenants").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("a row written in one test's database is visible in another's: %d rows", n)
	}
}
