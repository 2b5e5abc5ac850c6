package main

import (
	"context"
	"crypto/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
)

// eabKID and eabHMAC are the binding an EAB-requiring Pebble knows; wrongHMAC is
// another key of the same shape, which it does not.
const (
	eabKID    = "kid-certworker"
	eabHMAC   = "zWNDZM6eQGHWpSRTPal5eIUYFTu7EajVIoguysqZ9wG44nMEtx3MUAsUDkMTQ12W"
	wrongHMAC = "HnR8mdV8Ub0n7Lr1G3J9yXmvL2gQ5pZkT4sWc6aEoYfB0iNuD3hKxPjq7MtSw1Ra"
)

// The HMAC key files (--acme-eab-hmac-file, --acme-fallback-eab-hmac-file) and the
// CAA identities flags refuse what is wrong with exit 2 naming the flag, before
// anything connects, and never print a key: a file missing, empty or not base64url,
// both the file and the inline key (as flags or variables), an identity that is not
// a domain name. Guards against a worker that starts with no binding because its
// secret was not mounted, a leftover variable silently choosing the key, and a key
// in a log.
func TestEABHMACFileAndCAAIdentities_RefuseWhatIsWrong(t *testing.T) {
	for _, v := range []string{"CERTWORKER_ACME_EAB_HMAC", "CERTWORKER_ACME_EAB_HMAC_FILE", "CERTWORKER_ACME_FALLBACK_EAB_HMAC_FILE",
		"CERTWORKER_ACME_CAA_IDENTITIES", "CERTWORKER_ACME_FALLBACK_CAA_IDENTITIES"} {
		t.Setenv(v, "")
	}
	good := writeKeyFile(t, eabHMAC+"\n")
	empty := writeKeyFile(t, " \n")
	notB64 := writeKeyFile(t, "not base64 !!"+wrongHMAC+"\n")
	missing := filepath.Join(t.TempDir(), "missing")
	// Nothing is reached: every refusal comes before the connection.
	const nowhere = "postgres://x:y@127.0.0.1:1/none"
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"missing", nil, []string{"--acme-eab-hmac-file", missing}, "--acme-eab-hmac-file: open " + missing + ": no such file or directory"},
		{"empty", nil, []string{"--acme-eab-hmac-file", empty}, "--acme-eab-hmac-file " + empty + ": the file holds no key"},
		{"not base64url", nil, []string{"--acme-eab-hmac-file", notB64}, "--acme-eab-hmac-file " + notB64 + ": not base64url"},
		{"both flags", nil, []string{"--acme-eab-hmac", wrongHMAC, "--acme-eab-hmac-file", good}, "--acme-eab-hmac and --acme-eab-hmac-file are both set"},
		{"flag and variable", map[string]string{"CERTWORKER_ACME_EAB_HMAC": wrongHMAC}, []string{"--acme-eab-hmac-file", good}, "are both set"},
		{"variables", map[string]string{"CERTWORKER_ACME_EAB_HMAC": wrongHMAC, "CERTWORKER_ACME_EAB_HMAC_FILE": good}, nil, "are both set"},
		{"fallback missing", nil, []string{"--acme-fallback-eab-hmac-file", missing}, "--acme-fallback-eab-hmac-file: open " + missing},
		{"fallback empty", map[string]string{"CERTWORKER_ACME_FALLBACK_EAB_HMAC_FILE": empty}, nil, "--acme-fallback-eab-hmac-file " + empty + ": the file holds no key"},
		{"fallback not base64url", nil, []string{"--acme-fallback-eab-hmac-file", notB64}, "--acme-fallback-eab-hmac-file " + notB64 + ": not base64url"},
		{"caa identity", nil, []string{"--acme-caa-identities", "letsencrypt.org,https://pki.goog"}, `--acme-caa-identities: "https://pki.goog" is not an issuer domain name`},
		{"fallback caa identity", map[string]string{"CERTWORKER_ACME_FALLBACK_CAA_IDENTITIES": "pki goog"}, nil, `--acme-fallback-caa-identities: "pki goog" is not an issuer domain name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			code, stdout, stderr := invoke(t, append([]string{"run", "--database-url", nowhere}, tc.args...)...)
			require.Equal(t, exitUsage, code, stderr)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tc.want)
			require.NotContains(t, stderr, wrongHMAC)
			require.NotContains(t, stderr, eabHMAC)
			require.NotContains(t, stderr, "127.0.0.1:1", "refused before connecting")
		})
	}
}

// An HMAC key the CA does not accept stops run at start with exit 2, naming the
// directory and the key id, and --acme-eab-hmac-file or the key id to check, never
// the key, before anything is claimed or ordered. Guards against a worker that
// starts, then fails (or charges) every domain because the CA will not register
// its account.
func TestRun_AnEABKeyTheCARefusesStopsRun(t *testing.T) {
	t.Parallel()
	pool, dsn := pgtest.NewPool(t)
	ca := pebbletest.StartT(t, pebbletest.Options{RequireEAB: true, EABKeys: map[string]string{eabKID: eabHMAC}})
	id := pgtest.Domain(t, pool, pgtest.Tenant(t, pool), "eab-refused.example")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"wrong key", []string{"--acme-eab-kid", eabKID, "--acme-eab-hmac-file", writeKeyFile(t, wrongHMAC+"\n")},
			"certworker: the CA at " + ca.DirectoryURL + " refused the external account binding with key id " + eabKID + " (urn:ietf:params:acme:error:unauthorized: "},
		{"unknown key id", []string{"--acme-eab-kid", "kid-unknown", "--acme-eab-hmac", wrongHMAC},
			"refused the external account binding with key id kid-unknown (urn:ietf:params:acme:error:unauthorized: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := invokeWithin(t, time.Minute, "run did not stop at start: it runs with a binding the CA refuses",
				append([]string{"run", "--database-url", dsn,
					"--acme-directory", ca.DirectoryURL, "--acme-ca-bundle", ca.RootsFile, "--acme-profile", pebbletest.DefaultProfile,
					"--preflight", "off", "--http01-listen", "", "--admin-listen", ""}, tc.args...)...)
			require.Equal(t, exitUsage, code, stderr)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tc.want)
			require.Contains(t, stderr, "check the key id and the HMAC key the CA gave (--acme-eab-kid, --acme-eab-hmac-file or --acme-eab-hmac)")
			require.NotContains(t, stderr, wrongHMAC)
			require.NotContains(t, stderr, eabHMAC)
		})
	}
	require.Zero(t, ca.NewAccounts())
	require.Zero(t, ca.OrderRequests())
	var status string
	var attempts int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT ssl_status, ssl_attempts FROM proxy_domains WHERE id = $1`, id).Scan(&status, &attempts))
	require.Equal(t, "pending", status)
	require.Zero(t, attempts)
	var accounts int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM certworker_acme_accounts`).Scan(&accounts))
	require.Zero(t, accounts, "the refused key was kept")
}

// `run` with --acme-eab-kid and --acme-eab-hmac-file against a CA that requires
// external account binding registers the account at start and issues a verified
// domain; the key is in no log line. Guards against the file flag being read and
// then not used, and against the HMAC key reaching a log.
func TestRun_IssuesWithTheEABKeyFromAFile(t *testing.T) {
	t.Parallel()
	bin := buildCertworker(t)
	pool, dsn := pgtest.NewPool(t)
	http01, admin := workertest.FreeAddr(t), workertest.FreeAddr(t)
	_, port, _ := net.SplitHostPort(http01)
	httpPort, _ := strconv.Atoi(port)
	ca := pebbletest.StartT(t, pebbletest.Options{HTTPPort: httpPort, RequireEAB: true, EABKeys: map[string]string{eabKID: eabHMAC}})

	logs, stop := startBinary(t, bin, "run", "--database-url", dsn,
		"--acme-directory", ca.DirectoryURL, "--acme-ca-bundle", ca.RootsFile, "--acme-profile", pebbletest.DefaultProfile,
		"--acme-eab-kid", eabKID, "--acme-eab-hmac-file", writeKeyFile(t, "\n  "+eabHMAC+"\r\n"),
		"--http01-listen", http01, "--admin-listen", admin, "--preflight", "off",
		"--poll-interval", "2s", "--retry-base", "1s", "--shutdown-grace", "5s", "--log-level", "debug")

	waitFor(t, logs, 30*time.Second, "run never registered its account at start", func() bool { return ca.NewAccounts() == 1 })
	require.Zero(t, ca.OrderRequests(), "registered before any domain was due")
	name := "eab-" + strings.ToLower(rand.Text()[:10]) + ".example"
	pgtest.Domain(t, pool, pgtest.Tenant(t, pool), name)
	waitFor(t, logs, 60*time.Second, "the domain never became active", func() bool {
		var status string
		return pool.QueryRow(context.Background(), `SELECT ssl_status FROM proxy_domains WHERE domain = $1`, name).Scan(&status) == nil &&
			status == "active"
	})
	var kid string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT eab_kid FROM certworker_acme_accounts WHERE uri <> ''`).Scan(&kid))
	require.Equal(t, eabKID, kid)
	require.Equal(t, 1, ca.NewAccounts())

	stop()
	require.NotContains(t, logs.String(), eabHMAC, "the HMAC key reached the log")
}

// startBinary starts bin with args, its output in the returned buffer (logged when
// the test fails); stop sends SIGTERM and requires an exit 0 within 30 s. The
// process is killed when the test ends, if still running.
func startBinary(t *testing.T, bin string, args ...string) (logs *workertest.Buffer, stop func()) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	logs = &workertest.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var done bool
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("certworker %s's log:\n%s", args[0], logs)
		}
		if !done {
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	return logs, func() {
		t.Helper()
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		select {
		case err := <-exited:
			done = true
			require.NoError(t, err, "certworker %s did not exit 0 on SIGTERM", args[0])
		case <-time.After(30 * time.Second):
			t.Fatalf("certworker %s did not stop on SIGTERM", args[0])
		}
	}
}

// invokeWithin is invoke for a command expected to return by itself (run stopping at
// start): the test fails with why when it has not returned within d.
func invokeWithin(t *testing.T, d time.Duration, why string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	type result struct {
		code           int
		stdout, stderr string
	}
	done := make(chan result, 1)
	go func() {
		code, stdout, stderr := invoke(t, args...)
		done <- result{code, stdout, stderr}
	}()
	select {
	case r := <-done:
		return r.code, r.stdout, r.stderr
	case <-time.After(d):
		t.Fatal(why)
		return 0, "", ""
	}
}
