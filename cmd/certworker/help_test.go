package main

import (
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/require"
)

// `run --help` is a map: its groups in the order an operator sets certworker up, each
// with its flags, and a pointer to docs/reference.md. Guards against the list it was,
// where --key-encryption-key and --acme-fallback-eab-hmac-file came before
// --acme-directory.
func TestCLI_RunHelpListsTheGroupsInTheOperatorsOrder(t *testing.T) {
	code, stdout, _ := invoke(t, "run", "--help")
	require.Equal(t, exitOK, code)
	require.Contains(t, strings.Join(strings.Fields(stdout), " "), "docs/reference.md lists every flag")

	var headings []string
	for _, line := range strings.Split(stdout, "\n") {
		if strings.HasSuffix(line, ":") && !strings.HasPrefix(line, " ") && line != "Flags:" {
			headings = append(headings, line)
		}
	}
	var titles []string
	var runGroups []kong.Group
	for _, g := range flagGroups {
		if g.Key == "selection" {
			continue // status's own: run has no flag in it
		}
		titles = append(titles, g.Title)
		runGroups = append(runGroups, g)
	}
	require.Equal(t, []string{"Database:", "The CA:", "A second CA:", "Limits:", "Preflight and DNS:", "Keys:", "Listeners:", "Logs and timing:"}, titles)
	require.Equal(t, titles, headings, "run --help's group headings, in order")
	for _, g := range runGroups {
		require.Contains(t, stdout, g.Title+"\n  "+g.Description[:20], "group %s has its one-line description under its title", g.Key)
	}

	// Each flag is listed under its group, the groups in that order: a flag's first
	// appearance at the start of a line (its own entry, not a mention in another's help).
	at := func(flag string) int {
		i := strings.Index(stdout, "\n  "+flag+"=")
		if i < 0 {
			i = strings.Index(stdout, "\n  "+flag+" ")
		}
		require.GreaterOrEqual(t, i, 0, "%s is not listed", flag)
		return i
	}
	order := []string{"--database-url", "--acme-directory", "--acme-fallback-directory", "--limit-orders-per-account",
		"--preflight", "--key-encryption-key", "--http01-listen", "--log-format"}
	for i := 1; i < len(order); i++ {
		require.Less(t, at(order[i-1]), at(order[i]), "%s before %s", order[i-1], order[i])
	}
	for i, title := range titles {
		require.Less(t, strings.Index(stdout, "\n"+title), at(order[i]), "%s is under %s", order[i], title)
		if i+1 < len(titles) {
			require.Less(t, at(order[i]), strings.Index(stdout, "\n"+titles[i+1]), "%s is under %s", order[i], title)
		}
	}
	require.NotContains(t, stdout, "Flags:\n  -h, --help    Show context-sensitive help.\n\n      --", "no run flag is left outside a group")
}

// Every flag of every command but --help names one of flagGroups: a flag added
// without a group, or with a key that is not one (group:"limit"), would be listed
// apart from the map, under a heading of its own.
func TestCLI_EveryFlagIsInADeclaredGroup(t *testing.T) {
	known := map[string]bool{}
	for _, g := range flagGroups {
		known[g.Key] = true
	}
	var c cli
	parser, err := kong.New(&c, kong.Vars{"version": versionLine(), "le": letsEncrypt}, kong.ExplicitGroups(flagGroups))
	require.NoError(t, err)
	for _, cmd := range parser.Model.Children {
		for _, f := range cmd.Flags {
			if f.Name == "help" {
				continue
			}
			if cmd.Name == "status" && f.Name == "json" {
				continue // the output's form, the one flag of its kind
			}
			require.NotNil(t, f.Group, "%s --%s has no group:\"...\" tag", cmd.Name, f.Name)
			require.True(t, known[f.Group.Key], "%s --%s: group %q is not one of flagGroups", cmd.Name, f.Name, f.Group.Key)
		}
	}
}

// `certworker --help` and `run --help` point at docs/reference.md, where every flag is
// described.
func TestCLI_HelpLinksToTheReference(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"run", "--help"}} {
		code, stdout, _ := invoke(t, args...)
		require.Equal(t, exitOK, code, args)
		require.Contains(t, stdout, "docs/reference.md", args)
	}
}
