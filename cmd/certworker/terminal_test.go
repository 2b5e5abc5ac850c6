package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
)

// hostile is what a tenant may put in a name or provoke in an error: an escape
// sequence that sets the terminal's title and clears the screen, a bidirectional
// override, a tab that shifts status's columns, a carriage return that overwrites the
// line, and a backslash that must not pass for an escape.
const hostile = "\x1b]0;owned\x07\x1b[2J\u202egnp.exe\tX\rY\\x41"

// terminalSafe fails when s holds anything but printable text and newlines.
func terminalSafe(t *testing.T, s string) {
	t.Helper()
	for i, r := range s {
		if r == '\n' {
			continue
		}
		require.False(t, needsEscape(r), "byte %d of the output is %U, which acts on the terminal: %q", i, r, s)
	}
}

// `status` and `status DOMAIN` never print a control character a tenant put in a
// name or an error: they are escaped, readable, and the JSON output carries the
// values exactly (encoding/json escapes them). Guards against an operator's terminal
// run by another tenant's data.
func TestCLI_StatusEscapesWhatATenantControls(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	execSQL(t, dsn, `
WITH t AS (INSERT INTO proxy_tenants (name, slug, email) VALUES ('t', 't', 't@example.com') RETURNING id)
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider, ssl_attempts, ssl_error, ssl_profile)
SELECT id, 'evil'||$1||'.example', 'verified', 'tok', 'failed', 'acme', 10, 'boom '||$1, $1 FROM t`, hostile)

	for _, args := range [][]string{
		{"status", "--database-url", dsn},
		{"status", "evil" + hostile + ".example", "--database-url", dsn},
	} {
		code, stdout, stderr := invoke(t, args...)
		require.Equal(t, exitOK, code, stderr)
		terminalSafe(t, stdout)
		require.Contains(t, stdout, `boom \x1b]0;owned\a\x1b[2J\u202egnp.exe\tX\rY\\x41`, "the error is shown, escaped")
	}
	code, stdout, _ := invoke(t, "status", "--json", "--database-url", dsn)
	require.Equal(t, exitOK, code)
	terminalSafe(t, stdout)
	var o struct {
		Domains []struct {
			SSLError string `json:"ssl_error"`
		} `json:"domains"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &o))
	require.Len(t, o.Domains, 1)
	require.Equal(t, "boom "+hostile, o.Domains[0].SSLError)

	code, _, stderr := invoke(t, "retry", "nothere"+hostile+".example", "--database-url", dsn)
	require.Equal(t, exitFailed, code)
	terminalSafe(t, stderr)
}

// What the database cannot hold but a Go error may: bytes that are not UTF-8, shown
// as \xNN; printable text, other scripts included, is left alone.
func TestShown(t *testing.T) {
	t.Parallel()
	require.Equal(t, `a\xffb`, shown("a\xffb"))
	require.Equal(t, "bücher.example – ok", shown("bücher.example – ok"))
	require.Equal(t, `\u200bx\u2028`, shown("\u200bx\u2028"))
	require.Equal(t, `\U000e0001`, shown("\U000e0001"), "a tag character (format)")
	require.Equal(t, `\u009b31m`, shown("\u009b31m"), "a C1 control (CSI)")
}
