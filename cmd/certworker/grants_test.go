package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue"
)

// grantsFile holds every grant `run` needs (README, "Least privilege").
const grantsFile = "../../deploy/grants.sql"

// `run` works under a role that holds only deploy/grants.sql's rights: it starts,
// reports ready, issues a certificate from Pebble and stops cleanly, and the role can
// do nothing else (no DDL, no deletes of the proxy's rows, no reading its tenants).
// With --wake logical the role needs REPLICATION besides. Guards against a grant list
// that falls behind the code (the binary would log "permission denied" and never
// issue), and against one that grants more than the worker uses.
func TestRun_IssuesUnderLeastPrivilege(t *testing.T) {
	t.Parallel()
	bin := buildCertworker(t)
	for _, wake := range []string{"notify", "logical"} {
		t.Run(wake, func(t *testing.T) {
			t.Parallel()
			var adminDSN string
			if wake == "logical" {
				adminDSN = pgtest.StartServer(t, "wal_level=logical").NewDatabase(t)
			} else {
				adminDSN = pgtest.NewDB(t)
			}
			runDSN := leastPrivilegeRole(t, adminDSN, wake == "logical")
			issueThroughBinary(t, bin, adminDSN, runDSN, wake)
		})
	}
}

// buildCertworker builds this command into the test's temporary directory.
func buildCertworker(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "certworker")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "build certworker: %s", out)
	return bin
}

// leastPrivilegeRole creates a login role holding only deploy/grants.sql's rights on
// adminDSN's database (and REPLICATION when asked), checks what it may not do, and
// returns a URL that connects as it. The role is dropped when the test ends.
func leastPrivilegeRole(t *testing.T, adminDSN string, replication bool) string {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, adminDSN)
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close(context.Background()) })
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "certworker_run_" + hex.EncodeToString(b[:])
	attrs := "LOGIN PASSWORD 'run-secret'"
	if replication {
		attrs += " REPLICATION"
	}
	_, err = admin.Exec(ctx, "CREATE ROLE "+role+" "+attrs)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = admin.Exec(context.Background(), "DROP ROLE "+role)
	})
	grants, err := os.ReadFile(grantsFile)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, strings.ReplaceAll(string(grants), `:"role"`, `"`+role+`"`))
	require.NoError(t, err, "apply %s", grantsFile)

	u, err := url.Parse(adminDSN)
	require.NoError(t, err)
	u.User = url.UserPassword(role, "run-secret")
	runDSN := u.String()

	conn, err := pgx.Connect(ctx, runDSN)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, stmt := range []string{
		`CREATE TABLE certworker_scratch (id int)`,
		`ALTER TABLE proxy_domains ADD COLUMN scratch int`,
		`DELETE FROM proxy_domains`,
		`INSERT INTO proxy_domains (tenant_id, domain, verification_token) VALUES (gen_random_uuid(), 'x.example', 't')`,
		`SELECT count(*) FROM proxy_tenants`,
		`TRUNCATE proxy_certificates`,
		`UPDATE proxy_tenants SET name = name`,
		`TRUNCATE certworker_http01_tokens`,
	} {
		_, err := conn.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: want permission denied, got %v", stmt, err)
		require.Equal(t, "42501", pgErr.Code, "%s: %s", stmt, pgErr.Message)
	}
	return runDSN
}

// issueThroughBinary runs `certworker run` on runDSN against a fresh Pebble, waits
// for /readyz through `certworker healthcheck`, has the proxy (adminDSN) verify a
// domain, and waits for its certificate; then stops the worker with SIGTERM.
func issueThroughBinary(t *testing.T, bin, adminDSN, runDSN, wake string) {
	t.Helper()
	ctx := context.Background()
	http01, admin := workertest.FreeAddr(t), workertest.FreeAddr(t)
	_, port, _ := net.SplitHostPort(http01)
	httpPort, _ := strconv.Atoi(port)
	ca := pebbletest.StartT(t, pebbletest.Options{HTTPPort: httpPort})

	cmd := exec.Command(bin, "run",
		"--database-url", runDSN,
		"--acme-directory", ca.DirectoryURL,
		"--acme-ca-bundle", ca.RootsFile,
		"--acme-profile", pebbletest.DefaultProfile,
		"--http01-listen", http01,
		"--admin-listen", admin,
		"--wake", wake,
		"--preflight", "off", // the test's names resolve only in Pebble's DNS
		"--poll-interval", "2s",
		"--retry-base", "1s",
		"--shutdown-grace", "5s")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	logs := &workertest.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	defer func() {
		if t.Failed() {
			t.Logf("certworker run's log:\n%s", logs)
		}
	}()

	require.Eventually(t, func() bool {
		code, _, _ := invoke(t, "healthcheck", "--admin-listen", admin, "--timeout", "1s")
		return code == exitOK
	}, 30*time.Second, 100*time.Millisecond, "certworker healthcheck never passed")

	proxy, err := pgx.Connect(ctx, adminDSN)
	require.NoError(t, err)
	defer proxy.Close(ctx)
	name := "granted-" + strings.ToLower(rand.Text()[:10]) + ".example"
	_, err = proxy.Exec(ctx, `
WITH t AS (INSERT INTO proxy_tenants (name, slug, email) VALUES ('shop', $1, 'shop@example.com') RETURNING id)
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token)
SELECT id, $1, 'verified', 'tok' FROM t`, name)
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		var status string
		return proxy.QueryRow(ctx, `SELECT ssl_status FROM proxy_domains WHERE domain = $1`, name).Scan(&status) == nil &&
			status == "active"
	}, 60*time.Second, 100*time.Millisecond, "the domain never became active")
	var chain string
	require.NoError(t, proxy.QueryRow(ctx, `SELECT certificate_pem FROM proxy_certificates WHERE domain = $1`, name).Scan(&chain))
	leaf, err := queue.LeafFromPEM(chain)
	require.NoError(t, err)
	require.Equal(t, []string{name}, leaf.DNSNames)
	require.NotContains(t, logs.String(), "permission denied")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "run did not exit 0 on SIGTERM")
	case <-time.After(30 * time.Second):
		t.Fatal("run did not stop on SIGTERM")
	}
	exited <- nil // for the cleanup
}
