package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/certstore/seal"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
)

// The second CA's flags are checked before run connects anywhere, each bad
// combination naming its flag (issue #19): a second CA's setting without a second
// CA, the first CA named again, a non-positive wait, half an external account
// binding, a limit that does not parse, from the flag or its variable. Its HMAC key
// never reaches the message.
func TestCLI_BadFallbackFlagsExitTwoNamingTheFlag(t *testing.T) {
	t.Setenv("CERTWORKER_DATABASE_URL", "postgres://x:y@127.0.0.1:1/none")
	second := []string{"run", "--acme-fallback-directory", "https://second.invalid/directory"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--acme-fallback-profile", "tlsserver"}, "--acme-fallback-profile: names something of a second CA, and --acme-fallback-directory names none"},
		{[]string{"run", "--acme-fallback-eab-hmac", "c2VjcmV0aG1hY2tleQ"}, "--acme-fallback-eab-hmac: names something of a second CA"},
		{[]string{"run", "--acme-fallback-limit-certs-per-exact-set", "5/168h"}, "--acme-fallback-limit-certs-per-exact-set: names something of a second CA"},
		{[]string{"run", "--acme-directory", "https://one.invalid/dir", "--acme-fallback-directory", "https://one.invalid/dir"}, "--acme-fallback-directory: is --acme-directory"},
		{append(append([]string{}, second...), "--acme-fallback-after", "0s"), "--acme-fallback-after: must be positive"},
		{append(append([]string{}, second...), "--acme-fallback-after", "soon"), "--acme-fallback-after"},
		{append(append([]string{}, second...), "--acme-fallback-eab-hmac", "c2VjcmV0aG1hY2tleQ"), "--acme-fallback-eab-kid and --acme-fallback-eab-hmac: an external account binding needs both"},
		{append(append([]string{}, second...), "--acme-fallback-eab-kid", "kid-1"), "an external account binding needs both"},
		{append(append([]string{}, second...), "--acme-fallback-limit-orders-per-account", "lots"), "--acme-fallback-limit-orders-per-account"},
	} {
		code, _, stderr := invoke(t, tc.args...)
		require.Equal(t, exitUsage, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
		require.NotContains(t, stderr, "c2VjcmV0aG1hY2tleQ", "%v", tc.args)
		require.NotContains(t, stderr, "--database-url", "%v: checked before connecting", tc.args)
	}
	t.Setenv("CERTWORKER_ACME_FALLBACK_AFTER", "-1m")
	code, _, stderr := invoke(t, second...)
	require.Equal(t, exitUsage, code, stderr)
	require.Contains(t, stderr, "--acme-fallback-after", "the variable is read and checked")
}

// `run` with a second CA works under the role deploy/grants.sql makes: the first CA
// down from the start, a domain verified then is issued by the second after
// --acme-fallback-after, the certificate records the second's directory, and
// `status` says which CA issued it. Guards against grants that fall behind the
// routed claim's columns (ssl_ca_*, issuer_directory, the pauses' directory).
func TestRun_IssuesFromTheSecondCAUnderLeastPrivilege(t *testing.T) {
	t.Parallel()
	bin := buildCertworker(t)
	adminDSN := pgtest.NewDB(t)
	runDSN := leastPrivilegeRole(t, adminDSN)
	ctx := context.Background()
	http01, admin := workertest.FreeAddr(t), workertest.FreeAddr(t)
	_, port, _ := net.SplitHostPort(http01)
	httpPort, _ := strconv.Atoi(port)
	first := pebbletest.StartT(t, pebbletest.Options{HTTPPort: httpPort})
	front := pebbletest.NewFront(t, first)
	front.SetDown(true)
	second := pebbletest.StartT(t, pebbletest.Options{HTTPPort: httpPort})

	cmd := exec.Command(bin, "run",
		"--database-url", runDSN,
		"--acme-directory", front.DirectoryURL,
		"--acme-ca-bundle", first.RootsFile,
		"--acme-profile", pebbletest.DefaultProfile,
		"--acme-fallback-directory", second.DirectoryURL,
		"--acme-fallback-ca-bundle", second.RootsFile,
		"--acme-fallback-profile", pebbletest.DefaultProfile,
		"--acme-fallback-after", "1s",
		"--http01-listen", http01,
		"--admin-listen", admin,
		"--preflight", "off",
		"--poll-interval", "1s",
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

	proxy, err := pgx.Connect(ctx, adminDSN)
	require.NoError(t, err)
	defer proxy.Close(ctx)
	name := "second-" + strings.ToLower(rand.Text()[:10]) + ".example"
	_, err = proxy.Exec(ctx, `
WITH t AS (INSERT INTO proxy_tenants (name, slug, email) VALUES ('shop', $1, 'shop@example.com') RETURNING id)
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token)
SELECT id, $1, 'verified', 'tok' FROM t`, name)
	require.NoError(t, err)
	waitFor(t, logs, 60*time.Second, "the domain never became active", func() bool {
		var status string
		return proxy.QueryRow(ctx, `SELECT ssl_status FROM proxy_domains WHERE domain = $1`, name).Scan(&status) == nil &&
			status == "active"
	})
	var dir string
	require.NoError(t, proxy.QueryRow(ctx, `SELECT issuer_directory FROM proxy_certificates WHERE domain = $1`, name).Scan(&dir))
	require.Equal(t, second.DirectoryURL, dir)
	require.NotContains(t, logs.String(), "permission denied")
	require.Contains(t, logs.String(), `"cause":"outage"`)

	code, stdout, stderr := invoke(t, "status", "--database-url", adminDSN)
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, second.DirectoryURL, "status does not say which CA issued the certificates")
	code, stdout, stderr = invoke(t, "status", "--database-url", runDSN, name)
	require.Equal(t, exitOK, code, stderr)
	require.Regexp(t, `issued by the CA\s+`+regexp.QuoteMeta(second.DirectoryURL), stdout)
	require.Regexp(t, `last claim's CA\s+`+regexp.QuoteMeta(second.DirectoryURL)+` \(second CA: outage\)`, stdout)
}

// The start-up key check opens the second CA's account too: one sealed under a key
// run was not given stops it, exit 2 naming that account, before anything is
// claimed (issue #19: each CA has its own account).
func TestRun_ExitsTwoWhenTheSecondCAsAccountKeyDoesNotOpen(t *testing.T) {
	t.Setenv("CERTWORKER_KEY_ENCRYPTION_KEY", "")
	t.Setenv("CERTWORKER_KEY_ENCRYPTION_KEY_FILE", "")
	b := setupRekey(t)
	// The first account's key is a real one, which opens and parses.
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalECPrivateKey(ecKey)
	require.NoError(t, err)
	firstPEM := string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))
	_, err = b.pool.Exec(b.ctx, `UPDATE certworker_acme_accounts SET private_key_pem = $2 WHERE directory = $1`,
		rekeyDirectory, v2(t, b.oldKey, firstPEM, rekeyDirectory))
	require.NoError(t, err)
	const secondDir = "https://second.example/directory"
	_, err = b.pool.Exec(b.ctx, `INSERT INTO certworker_acme_accounts (directory, private_key_pem, uri) VALUES ($1, $2, 'https://second.example/acct/1')`,
		secondDir, v2(t, b.newKey, keyPEM("the second account"), secondDir))
	require.NoError(t, err)
	id := pgtest.Domain(t, b.pool, pgtest.Tenant(t, b.pool), "due.example")
	oldOnly := base64.StdEncoding.EncodeToString(b.oldKey)

	code, stdout, stderr := invoke(t, "run", "--database-url", b.dsn, "--acme-directory", rekeyDirectory,
		"--acme-fallback-directory", secondDir, "--http01-listen", "", "--admin-listen", "", "--key-encryption-key", oldOnly)
	require.Equal(t, exitUsage, code, stderr)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "cannot open the stored ACME account key of "+secondDir+": ")
	require.Contains(t, stderr, "(key id "+seal.KeyID(b.newKey)+")")
	require.NotContains(t, stderr, oldOnly)
	var status string
	var claimedBy *string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ssl_status, ssl_claimed_by FROM proxy_domains WHERE id = $1`, id).Scan(&status, &claimedBy))
	require.Equal(t, "pending", status)
	require.Nil(t, claimedBy, "run claimed before it checked the second account's key")
}

// --limit-consecutive-failures and its second CA's take a count of at least 2 or off;
// anything else exits 2 naming the flag, before connecting.
func TestCLI_BadConsecutiveFailuresExitsTwoNamingTheFlag(t *testing.T) {
	t.Setenv("CERTWORKER_DATABASE_URL", "postgres://x:y@127.0.0.1:1/none")
	for _, v := range []string{"1", "lots", "-3", "5/1h"} {
		code, _, stderr := invoke(t, "run", "--limit-consecutive-failures", v)
		require.Equal(t, exitUsage, code, "%s: %s", v, stderr)
		require.Contains(t, stderr, "--limit-consecutive-failures: ", v)
		require.NotContains(t, stderr, "--database-url", "%s: checked before connecting", v)
		code, _, stderr = invoke(t, "run", "--acme-fallback-directory", "https://two.invalid/dir",
			"--acme-fallback-limit-consecutive-failures", v)
		require.Equal(t, exitUsage, code, "%s: %s", v, stderr)
		require.Contains(t, stderr, "--acme-fallback-limit-consecutive-failures: ", v)
	}
}

// --limit-tenant-reserve takes a percentage from 0 (off) to 50%; anything else exits
// 2 naming the flag, before connecting.
func TestCLI_BadTenantReserveExitsTwoNamingTheFlag(t *testing.T) {
	t.Setenv("CERTWORKER_DATABASE_URL", "postgres://x:y@127.0.0.1:1/none")
	for _, v := range []string{"60%", "lots", "-5%"} {
		code, _, stderr := invoke(t, "run", "--limit-tenant-reserve", v)
		require.Equal(t, exitUsage, code, "%s: %s", v, stderr)
		require.Contains(t, stderr, "--limit-tenant-reserve: ", v)
		require.NotContains(t, stderr, "--database-url", "%s: checked before connecting", v)
	}
}
