package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
)

// historyFixture is a database with tenants a and b: a's shop.example failed after
// waiting for its DNS (a wait checked three times, then a failure), b's other.example
// retrying.
const historyFixture = `
INSERT INTO proxy_tenants (id, name, slug, email) VALUES
    ('00000000-0000-0000-0000-00000000000a', 'a', 'a', 'a@example.com'),
    ('00000000-0000-0000-0000-00000000000b', 'b', 'b', 'b@example.com');
INSERT INTO proxy_domains (id, tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider,
    ssl_attempts, ssl_error) VALUES
    ('10000000-0000-0000-0000-000000000001', '00000000-0000-0000-0000-00000000000a', 'shop.example', 'verified', 'tok',
     'failed', 'acme', 10, 'urn:ietf:params:acme:error:unauthorized: 404'),
    ('10000000-0000-0000-0000-000000000002', '00000000-0000-0000-0000-00000000000b', 'other.example', 'verified', 'tok',
     'failed', 'acme', 1, 'caa: forbidden');
SELECT certworker_domain_event('10000000-0000-0000-0000-000000000001', '00000000-0000-0000-0000-00000000000a',
    e, r, m, now()) FROM (VALUES ('claimed', NULL, NULL), ('waiting_for_dns', 'dns_not_pointed', 'waiting for DNS: no such name'),
    ('waiting_for_dns', 'dns_not_pointed', 'waiting for DNS: no such name'), ('waiting_for_dns', 'dns_not_pointed', 'waiting for DNS: no such name'),
    ('failed', 'too_many_failures', 'urn:ietf:params:acme:error:unauthorized: 404')) AS v (e, r, m);`

// `status DOMAIN` ends with the domain's history, newest first, a repeat shown once
// with its count, after its state and reason code; `--limit N` shows its N newest
// events; `--json` carries state, reason and events.
func TestCLI_StatusDomainEndsWithItsHistory(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	execSQL(t, dsn, historyFixture)

	code, stdout, stderr := invoke(t, "status", "shop.example", "--database-url", dsn)
	require.Equal(t, exitOK, code, stderr)
	_, history, ok := strings.Cut(stdout, "\nEvents:\n")
	require.True(t, ok, "no history at the end:\n%s", stdout)
	lines := strings.Split(strings.TrimSpace(history), "\n")
	require.Len(t, lines, 4, "a header and three events (the wait counted up):\n%s", history)
	require.Regexp(t, `^\s*LAST SEEN\s+FIRST SEEN\s+COUNT\s+EVENT\s+REASON\s+MESSAGE`, lines[0])
	require.Regexp(t, `\s1\s+failed\s+too_many_failures\s`, lines[1], "newest first")
	require.Regexp(t, `\s3\s+waiting_for_dns\s+dns_not_pointed\s+waiting for DNS: no such name`, lines[2])
	require.Regexp(t, `\s1\s+claimed\s`, lines[3])
	require.Regexp(t, `(?m)^state\s+failed$`, stdout)
	require.Regexp(t, `(?m)^reason\s+too_many_failures$`, stdout)

	code, stdout, _ = invoke(t, "status", "shop.example", "--limit", "1", "--database-url", dsn)
	require.Equal(t, exitOK, code)
	_, history, _ = strings.Cut(stdout, "\nEvents:\n")
	require.Len(t, strings.Split(strings.TrimSpace(history), "\n"), 2, "--limit 1: the newest event only")

	code, stdout, _ = invoke(t, "status", "--json", "shop.example", "--database-url", dsn)
	require.Equal(t, exitOK, code)
	var got struct {
		Domain string  `json:"domain"`
		State  string  `json:"state"`
		Reason *string `json:"reason"`
		Events []struct {
			Event  string  `json:"event"`
			Reason *string `json:"reason"`
			Count  int     `json:"count"`
		} `json:"events"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &got), stdout)
	require.Equal(t, "shop.example", got.Domain)
	require.Equal(t, "failed", got.State)
	require.Equal(t, "too_many_failures", *got.Reason)
	require.Len(t, got.Events, 3)
	require.Equal(t, "failed", got.Events[0].Event)
	require.Equal(t, 3, got.Events[1].Count)
}

// `status --tenant ID` counts and lists that tenant's domains only, and a domain of
// another tenant is unknown to it (exit 1); a --tenant that is no id, or a negative
// --limit, is bad usage (exit 2) naming the flag.
func TestCLI_StatusTenantAndLimit(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	execSQL(t, dsn, historyFixture)

	code, stdout, stderr := invoke(t, "status", "--json", "--tenant", "00000000-0000-0000-0000-00000000000b", "--database-url", dsn)
	require.Equal(t, exitOK, code, stderr)
	var o struct {
		Counts  map[string]int `json:"counts"`
		Domains []struct {
			Domain string `json:"domain"`
		} `json:"domains"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &o))
	require.Equal(t, 1, o.Counts["failed"], "tenant b's counts only")
	require.Len(t, o.Domains, 1)
	require.Equal(t, "other.example", o.Domains[0].Domain)

	code, stdout, _ = invoke(t, "status", "--json", "--limit", "1", "--database-url", dsn)
	require.Equal(t, exitOK, code)
	require.NoError(t, json.Unmarshal([]byte(stdout), &o))
	require.Equal(t, 2, o.Counts["failed"], "the counts are not limited")
	require.Len(t, o.Domains, 1, "--limit 1 lists one domain")

	code, _, stderr = invoke(t, "status", "shop.example", "--tenant", "00000000-0000-0000-0000-00000000000b", "--database-url", dsn)
	require.Equal(t, exitFailed, code)
	require.Contains(t, stderr, "shop.example: unknown domain", "another tenant's domain")

	code, _, stderr = invoke(t, "status", "--tenant", "shop", "--database-url", dsn)
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "--tenant")
	code, _, stderr = invoke(t, "status", "--limit", "-1", "--database-url", dsn)
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "--limit")
}
