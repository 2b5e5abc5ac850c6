package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker"
)

// `certworker version` and `certworker --version` print the same line: the release's
// version (VERSION), the commit and the Go version, and exit 0.
func TestVersion_CommandAndFlagPrintVersionCommitAndGo(t *testing.T) {
	want := "certworker " + certworker.Version() + " (commit " + buildCommit() + ", " + runtime.Version() + ")\n"
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, stdout, stderr := invoke(t, args...)
		require.Equal(t, exitOK, code, "%v: %s", args, stderr)
		require.Equal(t, want, stdout, "%v", args)
	}
}

// The commit is the revision go build recorded, -dirty when the tree had changes,
// and "unknown" with none recorded.
func TestVersion_CommitOfTheBuildSettings(t *testing.T) {
	const rev = "0123456789abcdef0123456789abcdef01234567"
	for _, tc := range []struct {
		settings []debug.BuildSetting
		want     string
	}{
		{nil, "unknown"},
		{[]debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "false"}}, rev},
		{[]debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "true"}}, rev + "-dirty"},
		{[]debug.BuildSetting{{Key: "vcs.modified", Value: "true"}}, "unknown"},
	} {
		require.Equal(t, tc.want, commitOf(tc.settings), "%v", tc.settings)
	}
}

// A plain `go build` in a git checkout, with no -ldflags, reports the checkout's
// commit, and the same commit -dirty once a file changed. Guards against a binary
// that says "commit unknown" unless built by the Makefile. The test copies the
// module into a fresh repository of one commit (a worktree's .git is a file, where
// go build records no revision) and builds there with Go's default -buildvcs=auto,
// whatever this machine's GOFLAGS say. It builds with -trimpath, as the other tests
// that build the binary do: the fresh repository's directory then keys none of the
// compiled packages, so both builds reuse what those tests compiled (without it, each
// run compiled the module's packages again: alone here, 10.7 s and 17 s of CPU, 7.1 s
// and 11 s with it), and -trimpath changes nothing the build records about version
// control.
func TestVersion_APlainGoBuildInACheckoutReportsItsCommit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary twice")
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	root := strings.TrimSpace(runIn(t, ".", nil, "git", "rev-parse", "--show-toplevel"))
	dir := t.TempDir()
	for _, f := range strings.Split(strings.TrimSpace(runIn(t, root, nil, "git", "ls-files", "-co", "--exclude-standard")), "\n") {
		b, err := os.ReadFile(filepath.Join(root, f))
		if os.IsNotExist(err) {
			continue // deleted in the work tree
		}
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	git := []string{"git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", "-c", "commit.gpgsign=false"}
	runIn(t, dir, nil, "git", "init", "-q")
	runIn(t, dir, nil, "git", "add", "-A")
	runIn(t, dir, nil, append(git, "commit", "-q", "-m", "test")...)
	rev := strings.TrimSpace(runIn(t, dir, nil, "git", "rev-parse", "HEAD"))

	env := []string{"GOFLAGS=-buildvcs=auto"}
	bin := filepath.Join(t.TempDir(), "certworker")
	runIn(t, dir, env, "go", "build", "-trimpath", "-o", bin, "./cmd/certworker")
	out := runIn(t, dir, nil, bin, "version")
	require.Equal(t, "certworker "+certworker.Version()+" (commit "+rev+", "+runtime.Version()+")\n", out)

	require.NoError(t, os.WriteFile(filepath.Join(dir, "README.md"), []byte("changed\n"), 0o644))
	runIn(t, dir, env, "go", "build", "-trimpath", "-o", bin, "./cmd/certworker")
	require.Contains(t, runIn(t, dir, nil, bin, "--version"), "(commit "+rev+"-dirty, ")
}

// runIn runs a command in dir with env added to the test's, and returns its stdout.
func runIn(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%v: %s", args, stderr.String())
	return string(out)
}

// certworker_build_info is 1, labelled with what `certworker version` prints.
func TestVersion_BuildInfoGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newBuildInfo())
	families, err := reg.Gather()
	require.NoError(t, err)
	require.Len(t, families, 1)
	require.Equal(t, "certworker_build_info", families[0].GetName())
	m := families[0].GetMetric()[0]
	require.Equal(t, 1.0, m.GetGauge().GetValue())
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	require.Equal(t, map[string]string{"version": certworker.Version(), "commit": buildCommit(), "go_version": runtime.Version()}, labels)
}
