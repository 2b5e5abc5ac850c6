package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
)

func TestMain(m *testing.M) {
	pgtest.Main(m, func() {
		if built.dir != "" {
			_ = os.RemoveAll(built.dir)
		}
	})
}

func invoke(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// A wrong or missing --database-url fails in one line with exit 2, and the password
// never appears: operators paste these lines into tickets. A server the URL names
// refusing it (a wrong password, no such database) is configuration too.
func TestCLI_BadDatabaseURLFailsInOneLineWithoutThePassword(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("CERTWORKER_DATABASE_URL", "")
	dsn := pgtest.NewDB(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"missing", []string{"status"}},
		{"unparseable", []string{"migrate", "--database-url", "postgres://admin:hunter2secret@[::1/db"}},
		{"wrong password", []string{"status", "--database-url", strings.Replace(dsn, "postgres:postgres@", "postgres:hunter2secret@", 1)}},
		{"no such database", []string{"retry", "x.example", "--database-url", withDatabase(t, dsn, "no_such_database")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			requireOneLineFailure(t, exitUsage, tc.args...)
		})
	}
}

// A database that cannot be reached is a failure, exit 1, not a configuration error
// (2): the URL may be right and the server down, and a script or a Job that retries
// on 1 must not give up as it would on a flag to fix. The message is still one line
// naming --database-url, without the password. Guards against status, retry and
// migrate exiting 2 ("bad usage or configuration") whenever PostgreSQL was away.
func TestCLI_UnreachableDatabaseExitsOne(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("CERTWORKER_DATABASE_URL", "")
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"status", []string{"status", "--database-url", "postgres://admin:hunter2secret@127.0.0.1:1/db"}},
		{"status DOMAIN", []string{"status", "x.example", "--database-url", "postgres://admin:hunter2secret@127.0.0.1:1/db"}},
		{"retry, keyword form", []string{"retry", "x.example", "--database-url", "host=127.0.0.1 port=1 dbname=db user=admin password=hunter2secret"}},
		{"migrate", []string{"migrate", "--database-url", "postgres://admin:hunter2secret@127.0.0.1:1/db"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stderr := requireOneLineFailure(t, exitFailed, tc.args...)
			require.Contains(t, stderr, "cannot connect to admin@127.0.0.1:1/db")
		})
	}
}

// requireOneLineFailure runs args and requires exit code want, nothing on stdout, and
// one line on stderr that names --database-url and not the password; it returns stderr.
func requireOneLineFailure(t *testing.T, want int, args ...string) string {
	t.Helper()
	code, stdout, stderr := invoke(t, args...)
	require.Equal(t, want, code, stderr)
	require.Empty(t, stdout)
	require.Equal(t, 1, strings.Count(strings.TrimSpace(stderr), "\n")+1, "not one line: %q", stderr)
	require.Contains(t, stderr, "--database-url")
	require.NotContains(t, stderr, "hunter2secret")
	return stderr
}

// withDatabase is dsn naming another database on the same server.
func withDatabase(t *testing.T, dsn, database string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.Path = "/" + database
	return u.String()
}

// An empty variable counts as unset, and a flag beats its variable.
func TestCLI_EnvironmentVariables(t *testing.T) {
	dsn := pgtest.NewDB(t)
	t.Setenv("CERTWORKER_DATABASE_URL", "")
	t.Setenv("DATABASE_URL", dsn)
	code, _, stderr := invoke(t, "status")
	require.Equal(t, exitOK, code, "DATABASE_URL was not used behind an empty CERTWORKER_DATABASE_URL: %s", stderr)
	t.Setenv("CERTWORKER_DATABASE_URL", "postgres://x:y@127.0.0.1:1/none")
	code, _, stderr = invoke(t, "status")
	require.Equal(t, exitFailed, code, "CERTWORKER_DATABASE_URL must come before DATABASE_URL: %s", stderr)
	require.Contains(t, stderr, "cannot connect to x@127.0.0.1:1/none")
	code, _, stderr = invoke(t, "status", "--database-url", dsn)
	require.Equal(t, exitOK, code, "the flag must beat the variable: %s", stderr)
}

func TestCLI_BadFlagsExitTwoNamingTheFlag(t *testing.T) {
	t.Setenv("CERTWORKER_DATABASE_URL", "postgres://x:y@127.0.0.1:1/none")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--poll-interval", "soon"}, "--poll-interval"},
		{[]string{"run", "--concurrency", "0"}, "--concurrency"},
		{[]string{"run", "--key-type", "dsa"}, "--key-type"},
		{[]string{"run", "--retry-base", "1h", "--retry-max", "1m"}, "--retry-max"},
		{[]string{"run", "--key-encryption-key", "c2hvcnQ="}, "--key-encryption-key"},
		{[]string{"run", "--log-level", "loud"}, "--log-level"},
		{[]string{"run", "--http01-max-connections", "0"}, "--http01-max-connections"},
		{[]string{"run", "--ari-requests-per-second", "0"}, "--ari-requests-per-second"},
		{[]string{"run", "--ari-requests-per-second", "-5"}, "--ari-requests-per-second"},
		{[]string{"run", "--ari-requests-per-second", "NaN"}, "--ari-requests-per-second"},
		{[]string{"run", "--ari-requests-per-second", "+Inf"}, "--ari-requests-per-second"},
		{[]string{"run", "--ari-requests-per-second", "lots"}, "--ari-requests-per-second"},
		{[]string{"frobnicate"}, "frobnicate"},
		// Only --wake logical opens a replication connection; it must read the
		// database the worker claims from; and its password stays out of the message.
		{[]string{"run", "--replication-database-url", "postgres://wake:hunter2secret@127.0.0.1:1/none"}, "--replication-database-url: only --wake logical"},
		{[]string{"run", "--wake", "logical", "--replication-database-url", "postgres://wake:hunter2secret@127.0.0.1:1/other"}, `names database "other" and --database-url "none"`},
		{[]string{"run", "--wake", "logical", "--replication-database-url", "postgres://wake:hunter2secret@[::1/none"}, "--replication-database-url"},
	} {
		code, _, stderr := invoke(t, tc.args...)
		require.Equal(t, exitUsage, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
		require.NotContains(t, stderr, "hunter2secret", "%v", tc.args)
	}
	t.Setenv("CERTWORKER_ARI_REQUESTS_PER_SECOND", "0")
	code, _, stderr := invoke(t, "run")
	require.Equal(t, exitUsage, code, stderr)
	require.Contains(t, stderr, "--ari-requests-per-second", "the variable is read and checked")
}

// A range --preflight-allow-cidr cannot read, from the flag or its variable, stops run
// before it connects anywhere, naming the flag and the value. Guards against a typo
// that silently leaves the preflight refusing the addresses the operator meant to
// allow, or allowing more than meant.
func TestCLI_BadPreflightAllowCIDRExitsTwoNamingTheFlag(t *testing.T) {
	t.Setenv("CERTWORKER_DATABASE_URL", "postgres://x:y@127.0.0.1:1/none")
	code, _, stderr := invoke(t, "run", "--preflight-allow-cidr", "127.0.0.0/8,10.0.0.0/33")
	require.Equal(t, exitUsage, code, stderr)
	require.Contains(t, stderr, `--preflight-allow-cidr: "10.0.0.0/33" is not a CIDR range`)

	t.Setenv("CERTWORKER_PREFLIGHT_ALLOW_CIDR", "10.0.0.1")
	code, _, stderr = invoke(t, "run")
	require.Equal(t, exitUsage, code, stderr)
	require.Contains(t, stderr, `--preflight-allow-cidr: "10.0.0.1" is not a CIDR range`)
	require.NotContains(t, stderr, "--database-url", "checked before connecting")
}

func TestCLI_HelpWorksOnEveryCommand(t *testing.T) {
	for _, cmd := range []string{"", "migrate", "run", "status", "retry", "version"} {
		args := []string{"--help"}
		if cmd != "" {
			args = []string{cmd, "--help"}
		}
		code, stdout, _ := invoke(t, args...)
		require.Equal(t, exitOK, code, cmd)
		require.Contains(t, stdout, "Usage:", cmd)
	}
}

// The operator commands against a real database: migrate is idempotent, status --json
// has the contract's shape, retry refuses what it cannot requeue with exit 1.
func TestCLI_MigrateStatusRetry(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	code, stdout, stderr := invoke(t, "migrate", "--database-url", dsn)
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "up to date", "a migrated database was migrated again")

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `
WITH t AS (INSERT INTO proxy_tenants (name, slug, email) VALUES ('t', 't', 't@example.com') RETURNING id)
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider, ssl_attempts, ssl_error, ssl_last_attempt_at)
SELECT id, d, v, 'tok', s, p, a, e, now() FROM t, (VALUES
    ('failed.example', 'verified', 'failed', 'acme', 10, 'acme: urn:ietf:params:acme:error:unauthorized: nope'),
    ('retrying.example', 'verified', 'pending', 'acme', 2, 'acme: connection refused'),
    ('unverified.example', 'pending', 'pending', 'acme', 0, NULL),
    ('manual.example', 'verified', 'active', 'manual', 0, NULL),
    ('active.example', 'verified', 'active', 'acme', 0, NULL)) AS v(d, v, s, p, a, e)`)
	require.NoError(t, err)

	code, stdout, stderr = invoke(t, "status", "--json", "--database-url", dsn)
	require.Equal(t, exitOK, code, stderr)
	var o struct {
		Counts  map[string]int   `json:"counts"`
		Domains []map[string]any `json:"domains"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &o), stdout)
	require.Equal(t, map[string]int{"pending": 2, "provisioning": 0, "active": 1, "failed": 1}, o.Counts)
	require.Len(t, o.Domains, 2)
	for _, d := range o.Domains {
		for _, k := range []string{"domain", "ssl_status", "ssl_attempts", "ssl_error", "next_attempt_at"} {
			require.Contains(t, d, k)
		}
		if d["domain"] == "failed.example" {
			require.Nil(t, d["next_attempt_at"], "a failed domain waits for retry")
		} else {
			require.NotNil(t, d["next_attempt_at"])
		}
	}

	for domain, reason := range map[string]string{
		"nosuch.example":     "unknown",
		"unverified.example": "not verified",
		"manual.example":     "ACME",
		"active.example":     "active",
	} {
		code, _, stderr := invoke(t, "retry", domain, "--database-url", dsn)
		require.Equal(t, exitFailed, code, domain)
		require.Contains(t, stderr, reason, domain)
	}
	code, stdout, stderr = invoke(t, "retry", "failed.example", "--database-url", dsn)
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "queued")
	code, stdout, _ = invoke(t, "status", "failed.example", "--database-url", dsn)
	require.Equal(t, exitOK, code)
	require.Regexp(t, `ssl_status\s+pending`, stdout)
}

// The DNS flags are checked before run connects anywhere, each error naming its flag:
// --dns01-zone needs --dns01-nameservers (the zone's NS records would otherwise name
// nothing), whose addresses must be addresses of names inside the zone, the rate
// limit's flags must not be negative and its exempt prefixes must be prefixes, a zone
// must be a domain name, --dns01-listen host:port, --dns-target a
// host name or addresses, --dns-wait-max positive. Guards against a zone served
// without name servers, and a typo that leaves DNS-01 silently off.
func TestCLI_BadDNSFlagsExitTwoNamingTheFlag(t *testing.T) {
	t.Setenv("CERTWORKER_DATABASE_URL", "postgres://x:y@127.0.0.1:1/none")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--dns01-zone", "acme.example.net"}, "--dns01-nameservers: required with --dns01-zone"},
		{[]string{"run", "--dns01-zone", "acme..example", "--dns01-nameservers", "ns1.example.net"}, "--dns01-zone"},
		{[]string{"run", "--dns01-zone", "single", "--dns01-nameservers", "ns1.example.net"}, "--dns01-zone"},
		{[]string{"run", "--dns01-zone", "acme.example.net", "--dns01-nameservers", "ns1.example.net", "--dns01-listen", "5353"}, "--dns01-listen"},
		{[]string{"run", "--dns01-zone", "acme.example.net", "--dns01-nameservers", "ns1.acme.example.net=not-an-address"}, "--dns01-nameservers"},
		{[]string{"run", "--dns01-zone", "acme.example.net", "--dns01-nameservers", "ns1.example.net=192.0.2.1"}, "--dns01-nameservers"},
		{[]string{"run", "--dns01-zone", "acme.example.net", "--dns01-nameservers", "ns1.example.net", "--dns01-rate-limit", "-1"}, "--dns01-rate-limit"},
		{[]string{"run", "--dns01-zone", "acme.example.net", "--dns01-nameservers", "ns1.example.net", "--dns01-rate-limit-slip", "-1"}, "--dns01-rate-limit-slip"},
		{[]string{"run", "--dns01-zone", "acme.example.net", "--dns01-nameservers", "ns1.example.net", "--dns01-rate-limit-exempt", "10.0.0.0/33"}, "--dns01-rate-limit-exempt"},
		{[]string{"run", "--dns-target", "proxy.example.net,10.0.0.1"}, "--dns-target"},
		{[]string{"run", "--dns-target", "not a name"}, "--dns-target"},
		{[]string{"run", "--dns-wait-max", "0s"}, "--dns-wait-max"},
	} {
		code, _, stderr := invoke(t, tc.args...)
		require.Equal(t, exitUsage, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
		require.NotContains(t, stderr, "--database-url", "checked before connecting: %v", tc.args)
	}
	t.Setenv("CERTWORKER_DNS01_ZONE", "acme.example.net")
	code, _, stderr := invoke(t, "run")
	require.Equal(t, exitUsage, code, stderr)
	require.Contains(t, stderr, "--dns01-nameservers", "the variable is read and checked")
}
