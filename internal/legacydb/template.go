package legacydb

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/certworker/certworker/internal/pgtest"
)

// templates holds, per server and size, the name of the template database the
// fixture was built in once, or the error building it.
var templates sync.Map // key string -> *template

type template struct {
	once sync.Once
	name string
	err  error
}

// New is a fresh copy of the fixture (opts' size) on srv, dropped when the test ends;
// it returns its URL. The fixture is built once per server in a template database
// (named after a hash of this package's SQL and the size, so that a server kept
// between runs rebuilds it only when the fixture changes), and each test gets a
// copy: copying is a file copy, much faster than building 100,000 rows again.
func New(t testing.TB, srv *pgtest.Server, opts Options) string {
	t.Helper()
	opts = opts.withDefaults()
	v, _ := templates.LoadOrStore(fmt.Sprintf("%s|%d|%d", srv.AdminURL, opts.Domains, opts.Tenants), &template{})
	tpl := v.(*template)
	tpl.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		tpl.name, tpl.err = buildTemplate(ctx, srv, opts)
	})
	if tpl.err != nil {
		t.Fatalf("legacy fixture: %v", tpl.err)
	}
	ctx := context.Background()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "legacy_" + hex.EncodeToString(b[:])
	if err := admin(ctx, srv, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, tpl.name)); err != nil {
		t.Fatalf("legacy fixture: copy: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = admin(ctx, srv, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name))
	})
	return srv.URL(name)
}

// buildTemplate builds the fixture in a database of its own, unless a previous run on
// the same server already has. Under an advisory lock, for test packages sharing a
// server (TEST_DATABASE_URL); built under a temporary name and renamed when complete,
// so that a build killed half way is never taken for a fixture.
func buildTemplate(ctx context.Context, srv *pgtest.Server, opts Options) (string, error) {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s|%s|%s|%s|%s|%d|%d",
		Schema, tenantsSQL, domainsSQL, certificatesSQL, oddRowsSQL, opts.Domains, opts.Tenants))
	name := "legacy_tpl_" + hex.EncodeToString(sum[:6])
	conn, err := pgx.Connect(ctx, srv.AdminURL)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	const lockID = 7427015
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockID); err != nil {
		return "", err
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockID) //nolint:errcheck
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}
	building := name + "_building"
	for _, stmt := range []string{
		"DROP DATABASE IF EXISTS " + building + " WITH (FORCE)",
		"CREATE DATABASE " + building,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return "", err
		}
	}
	fill, err := pgx.Connect(ctx, srv.URL(building))
	if err != nil {
		return "", err
	}
	err = Fill(ctx, fill, opts)
	fill.Close(ctx)
	if err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s", building, name)); err != nil {
		return "", err
	}
	return name, nil
}

func admin(ctx context.Context, srv *pgtest.Server, stmt string) error {
	conn, err := pgx.Connect(ctx, srv.AdminURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, stmt)
	return err
}
