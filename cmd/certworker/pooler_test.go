package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
)

// A direct connection is seen as one: every statement of a connection in one server
// session. Guards against a probe that refuses a good connection.
func TestDetectPooler_DirectConnection(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	verdict, evidence := detectPooler(context.Background(), pool)
	require.Equal(t, connSession, verdict, evidence)
	require.NoError(t, checkConnection(context.Background(), pool, zap.NewNop()))
}

// Through PgBouncer (Debian's package; .ci/run installs it): session mode passes,
// transaction and statement modes are refused with exit 2 naming --database-url.
// Without PgBouncer the test skips, but not in CI (CI set), where a skip would report
// a green run that never ran it.
func TestDetectPooler_PgBouncer(t *testing.T) {
	t.Parallel()
	bin := pgbouncer(t)
	dsn := pgtest.NewDB(t)
	for _, tc := range []struct {
		mode, want string
		poolSize   int
	}{
		{"session", connSession, 4},
		{"transaction", connTransaction, 4},
		{"transaction", connTransaction, 1},
		{"statement", connStatement, 4},
	} {
		t.Run(fmt.Sprintf("%s-%d", tc.mode, tc.poolSize), func(t *testing.T) {
			t.Parallel()
			pool := throughPgBouncer(t, bin, dsn, tc.mode, tc.poolSize)
			verdict, evidence := detectPooler(context.Background(), pool)
			require.Equal(t, tc.want, verdict, evidence)
			err := checkConnection(context.Background(), pool, zap.NewNop())
			if tc.want == connSession {
				require.NoError(t, err)
				return
			}
			var ue *usageError
			require.ErrorAs(t, err, &ue)
			require.Contains(t, ue.msg, "--database-url")
			require.Contains(t, ue.msg, tc.want)
		})
	}
}

// pgbouncer is the path of the pgbouncer binary. Where it is missing the test is
// skipped, or failed when the environment sets CI: .ci/run installs it, and a CI run
// that skipped this test would pass without checking what it exists for.
func pgbouncer(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	switch {
	case err == nil:
		return bin
	case os.Getenv("CI") != "":
		t.Fatalf("pgbouncer is not installed, and CI is set: this test must run in CI (.ci/run installs it: apt-get install pgbouncer): %v", err)
	default:
		t.Skip("pgbouncer is not installed (apt-get install pgbouncer); with CI set this fails")
	}
	return ""
}

// throughPgBouncer starts a PgBouncer in the given pool mode in front of dsn's server
// and returns a pool connected through it.
func throughPgBouncer(t *testing.T, bin, dsn, mode string, poolSize int) *pgxpool.Pool {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	pw, _ := u.User.Password()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())

	// PgBouncer refuses to run as root; it drops to nobody (-u), who must read this.
	dir, err := os.MkdirTemp("", "pgbouncer-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s user=%s password=%s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
ignore_startup_parameters = extra_float_digits,search_path
`, u.Hostname(), u.Port(), u.User.Username(), pw, port, filepath.Join(dir, "users.txt"), mode, poolSize)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "users.txt"), []byte(fmt.Sprintf("%q %q\n", u.User.Username(), pw)), 0o644))
	args := []string{filepath.Join(dir, "pgbouncer.ini")}
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "nobody"}, args...)
	}
	cmd := exec.Command(bin, args...)
	out := &workertest.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})

	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	q := u.Query()
	q.Set("pool_max_conns", "4")
	u.RawQuery = q.Encode()
	var pool *pgxpool.Pool
	require.Eventually(t, func() bool {
		p, err := pgxpool.New(context.Background(), u.String())
		if err != nil {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if p.Ping(ctx) != nil {
			p.Close()
			return false
		}
		pool = p
		return true
	}, 10*time.Second, 50*time.Millisecond, "pgbouncer did not start: %s", out)
	t.Cleanup(pool.Close)
	return pool
}
