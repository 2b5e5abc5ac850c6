package main

import (
	"testing"

	"github.com/stretchr/testify/require"
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
