package migrations_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
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
