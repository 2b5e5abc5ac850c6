package migrations_test

import (
	"context"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
)

// statusPage is the page that lists every state and reason code of
// certworker_domain_status.
const statusPage = "../docs/domain-status.md"

// pageCodes reads the first column of the table under heading in statusPage.
func pageCodes(t *testing.T, heading string) []string {
	t.Helper()
	page, err := os.ReadFile(statusPage)
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(page), "\n### "+heading+"\n")
	require.True(t, ok, "%s has no section %q", statusPage, heading)
	section, _, _ = strings.Cut(section, "\n#")
	var codes []string
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || strings.HasPrefix(line, "|---") {
			continue
		}
		code := strings.Trim(strings.TrimSpace(cells[1]), "`")
		if code != heading[:len(heading)-1] && code != "state" && code != "reason" {
			codes = append(codes, code)
		}
	}
	require.NotEmpty(t, codes, "%s: the table of %q has no rows", statusPage, heading)
	return codes
}

// producedCodes are the codes a function file can produce: every string literal that
// a THEN or an ELSE of its CASEs returns, whatever the branch (a literal of the text's
// own, such as a message, has spaces and is not a code).
func producedCodes(t *testing.T, files ...string) []string {
	t.Helper()
	lit := regexp.MustCompile(`\b(?:THEN|ELSE)\s+'([a-z_0-9]+)'`)
	var codes []string
	for _, f := range files {
		body, err := os.ReadFile("functions/" + f)
		require.NoError(t, err)
		for _, m := range lit.FindAllStringSubmatch(string(body), -1) {
			if !slices.Contains(codes, m[1]) {
				codes = append(codes, m[1])
			}
		}
	}
	return codes
}

// Every state and reason code certworker_domain_status and certworker_domain_reason
// can return is listed in docs/domain-status.md, and every one listed can be
// returned: the proxy's engineers write their tenant messages from that table, and a
// code it lacks would reach a tenant as a bare word.
func TestDomainStatus_EveryStateAndReasonIsDocumented(t *testing.T) {
	t.Parallel()
	states, reasons := pageCodes(t, "States"), pageCodes(t, "Reason codes")
	var documented []string
	documented = append(documented, states...)
	documented = append(documented, reasons...)
	produced := producedCodes(t, "certworker_domain_status.sql", "certworker_domain_reason.sql")
	for _, c := range produced {
		require.Contains(t, documented, c, "certworker_domain_status can return %q, which %s does not list", c, statusPage)
	}
	for _, c := range documented {
		require.Contains(t, produced, c, "%s lists %q, which no function returns", statusPage, c)
	}
	for _, want := range []string{"not_managed", "queued", "issuing", "waiting_for_dns", "waiting_for_ca", "issued", "renewing", "failed"} {
		require.Contains(t, states, want)
	}
	for _, want := range []string{"dns_not_pointed", "cname_missing", "caa_forbids", "rate_limited", "ca_unavailable",
		"invalid_name", "duplicate", "validation_failed", "profile_unavailable", "too_many_failures"} {
		require.Contains(t, reasons, want)
	}
}

// certworker_domain_status's cname_target is certworker_dns01_target's, which it
// computes itself from the settings row it reads: for a name, its wildcard, in any
// case, and a zone written with a trailing dot in capitals; NULL when DNS-01 is off.
func TestDomainStatus_CNAMETargetIsDNS01Target(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.NewDB(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `
INSERT INTO proxy_tenants (id, name, slug, email) VALUES ('00000000-0000-0000-0000-00000000000a', 'a', 'a', 'a@example.com');
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token)
SELECT '00000000-0000-0000-0000-00000000000a', d, 'verified', 'tok'
FROM unnest(ARRAY['shop.example', '*.Shop.Example', 'WWW.shop.example']) AS d`)
	require.NoError(t, err)
	compare := func(zone *string) {
		t.Helper()
		_, err := conn.Exec(ctx, `INSERT INTO certworker_settings (id, dns01_zone) VALUES (true, $1)
ON CONFLICT (id) DO UPDATE SET dns01_zone = EXCLUDED.dns01_zone`, zone)
		require.NoError(t, err)
		rows, err := conn.Query(ctx, `
SELECT d.domain, s.cname_target, certworker_dns01_target(d.domain)
FROM proxy_domains d CROSS JOIN LATERAL certworker_domain_status(d.id, d.tenant_id) s`)
		require.NoError(t, err)
		n := 0
		var domain string
		var got, want *string
		_, err = pgx.ForEachRow(rows, []any{&domain, &got, &want}, func() error {
			n++
			require.Equal(t, want, got, domain)
			require.Equal(t, zone == nil || *zone == "", got == nil, domain)
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, 3, n)
	}
	compare(nil)
	empty, zone := "", "ACME.Proxy.Example."
	compare(&empty)
	compare(&zone)
}
