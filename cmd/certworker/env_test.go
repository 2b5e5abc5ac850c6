package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"
)

// parseOnly parses args and the environment as run does, without running anything.
func parseOnly(t *testing.T, args ...string) *cli {
	t.Helper()
	var c cli
	parser, err := newParser(&c, io.Discard, io.Discard, func(code int) { t.Fatalf("exit %d", code) })
	require.NoError(t, err)
	_, err = parse(parser, args)
	require.NoError(t, err)
	return &c
}

// Every flag of every command is read from CERTWORKER_ + its name in upper case with
// - as _, first (--database-url then also DATABASE_URL). Guards against a variable
// named otherwise, as healthcheck --timeout's was (CERTWORKER_HEALTHCHECK_TIMEOUT):
// an operator who follows the rule sets a variable nothing reads.
func TestCLI_EveryFlagsVariableFollowsTheNamingRule(t *testing.T) {
	var c cli
	parser, err := newParser(&c, io.Discard, io.Discard, func(int) {})
	require.NoError(t, err)
	n := 0
	require.NoError(t, kong.Visit(parser.Model, func(node kong.Visitable, next kong.Next) error {
		f, ok := node.(*kong.Flag)
		if !ok || f.Name == "help" || f.Name == "version" {
			return next(nil)
		}
		want := "CERTWORKER_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		require.NotEmpty(t, f.Tag.Envs, "--%s has no variable", f.Name)
		require.Equal(t, want, f.Tag.Envs[0], "--%s", f.Name)
		if f.Name == "database-url" {
			require.Equal(t, []string{want, "DATABASE_URL"}, f.Tag.Envs)
		} else {
			require.Len(t, f.Tag.Envs, 1, "--%s", f.Name)
		}
		n++
		return next(nil)
	}))
	require.Greater(t, n, 60, "flags checked")

	t.Setenv("CERTWORKER_TIMEOUT", "250ms")
	require.Equal(t, 250*time.Millisecond, parseOnly(t, "healthcheck").Healthcheck.Timeout)
}

// An empty CERTWORKER_HTTP01_LISTEN or CERTWORKER_ADMIN_LISTEN turns the responder or
// the admin endpoints off, as an empty --http01-listen or --admin-listen does and as
// their help says; any other empty variable still counts as unset (here
// --poll-interval keeps its default). Guards against an empty variable bringing the
// default back, as it did: the responder still bound :80.
func TestCLI_AnEmptyListenVariableTurnsItsServerOff(t *testing.T) {
	t.Setenv("CERTWORKER_HTTP01_LISTEN", "")
	t.Setenv("CERTWORKER_ADMIN_LISTEN", "")
	t.Setenv("CERTWORKER_POLL_INTERVAL", "")
	c := parseOnly(t, "run")
	require.Equal(t, "", c.Run.HTTP01Listen)
	require.Equal(t, "", c.Run.AdminListen)
	require.Equal(t, 30*time.Second, c.Run.PollInterval)

	t.Setenv("CERTWORKER_HTTP01_LISTEN", "")
	t.Setenv("CERTWORKER_ADMIN_LISTEN", "")
	code, stdout, stderr := invoke(t, "healthcheck")
	require.Equal(t, exitFailed, code)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "--admin-listen is empty: the admin endpoints are off")

	t.Setenv("CERTWORKER_HTTP01_LISTEN", "")
	c = parseOnly(t, "run", "--http01-listen", ":8080")
	require.Equal(t, ":8080", c.Run.HTTP01Listen, "the flag beats its variable")
}
