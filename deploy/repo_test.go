package deploy_test

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// repoRoot is the repository's top directory, or the test skips when the tests do not
// run from a git checkout (a source tarball).
func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skip("not a git checkout")
	}
	return strings.TrimSpace(string(out))
}

// git runs git in dir and returns its combined output.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com",
		"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "git %s: %s", strings.Join(args, " "), out)
	return string(out)
}

// .ci/check-large-files, which .ci/run runs before anything else, fails naming a file
// over 1 MB in HEAD's tree (a file with a space in its name too), and passes a tree of
// small ones. Guards against a build output committed again, as the 28 MB binary at
// the root was.
func TestCI_FailsWhenHEADHoldsAFileOverOneMB(t *testing.T) {
	t.Parallel()
	script := filepath.Join(repoRoot(t), ".ci", "check-large-files")
	dir := t.TempDir()
	git(t, dir, "init", "-q")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "small.txt"), make([]byte, 1000), 0o600))
	git(t, dir, "add", ".")
	git(t, dir, "commit", "-q", "-m", "small")
	check := exec.Command(script)
	check.Dir = dir
	out, err := check.CombinedOutput()
	require.NoError(t, err, "%s", out)

	require.NoError(t, os.WriteFile(filepath.Join(dir, "a binary"), make([]byte, 1_000_001), 0o600))
	git(t, dir, "add", ".")
	git(t, dir, "commit", "-q", "-m", "big")
	check = exec.Command(script)
	check.Dir = dir
	out, err = check.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	require.Equal(t, 1, exit.ExitCode())
	require.Contains(t, string(out), "a binary (1000001 bytes)")
	require.NotContains(t, string(out), "small.txt")

	run, err := os.ReadFile(filepath.Join(repoRoot(t), ".ci", "run"))
	require.NoError(t, err)
	require.Contains(t, string(run), "\n.ci/check-large-files\n")
	require.Contains(t, string(run), "\nmake test\n", ".ci/run still runs the tests")
}

// The repository's own HEAD passes that check, and build outputs, test artefacts and
// compose's .env (passwords) are ignored while the sources are not. Guards against the
// committed binary coming back.
func TestRepository_HoldsNoBuildOutput(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	check := exec.Command(filepath.Join(root, ".ci", "check-large-files"))
	check.Dir = root
	out, err := check.CombinedOutput()
	require.NoError(t, err, "%s", out)

	for _, path := range []string{"certworker", "bin/certworker", "bin/image/certworker", "acme/acme.test", "cover.out", "cpu.prof", "deploy/.env"} {
		cmd := exec.Command("git", "check-ignore", "-q", "--no-index", path)
		cmd.Dir = root
		require.NoError(t, cmd.Run(), "%s is not ignored", path)
	}
	for _, path := range []string{"cmd/certworker/main.go", "deploy/.env.example", "deploy/compose.yaml"} {
		cmd := exec.Command("git", "check-ignore", "-q", "--no-index", path)
		cmd.Dir = root
		require.Error(t, cmd.Run(), "%s is ignored", path)
	}
}

// issueRef is a pointer at the tracker: "issue #17", "issues 13 and 18", "(#19)".
// PKCS #8 is a standard's name, not an issue.
var issueRef = regexp.MustCompile(`(?i)\bissues? ?#?[0-9]+|(^|[^\w&])#[0-9]{1,3}\b`)

// Comments in production code, the Makefile, CI and the deploy files state the rule
// they rely on, or the page of docs/ that holds it, never an issue number, which a reader of
// the code cannot open. Guards against the 33 such comments there were ("The claim
// reads only what it can take (issue #17)"). Test files may still name one.
func TestRepository_CommentsNameTheRuleNotTheIssue(t *testing.T) {
	t.Parallel()
	var found []string
	for _, rel := range repoFiles(t) {
		production := strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go")
		if !production && rel != "Makefile" && !strings.HasPrefix(rel, "deploy/") && !strings.HasPrefix(rel, ".ci/") {
			continue
		}
		if strings.HasSuffix(rel, "_test.go") || strings.HasSuffix(rel, "_test.yaml") {
			continue
		}
		for i, line := range repoLines(t, rel) {
			if m := issueRef.FindString(strings.ReplaceAll(line, "PKCS #", "PKCS ")); m != "" {
				found = append(found, fmt.Sprintf("%s:%d: %s", rel, i+1, strings.TrimSpace(line)))
			}
		}
	}
	require.Empty(t, found, "name the rule or the docs/ page that holds it instead of the issue")
}

// repoFiles is every file of the repository (seen from deploy/), relative to its top
// with slashes, hidden folders left out but .ci.
func repoFiles(t *testing.T) []string {
	t.Helper()
	root := ".."
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && rel != "." && rel != ".ci" {
				return filepath.SkipDir
			}
			return nil
		}
		files = append(files, rel)
		return nil
	})
	require.NoError(t, err)
	return files
}

// repoLines is the lines of the repository's file rel.
func repoLines(t *testing.T, rel string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", filepath.FromSlash(rel)))
	require.NoError(t, err)
	return strings.Split(string(b), "\n")
}

// outsideRef is a citation of the interface specification the project was built
// against, which lives outside the repository (its file name, with or without ".md",
// and a section number). The character class keeps this line from matching itself.
var outsideRef = regexp.MustCompile(`[C]ONTRACT(\.md)?\b`)

// No file of the repository, code, tests, migrations or docs, cites a file a clone
// does not hold: it states the rule, or cites the docs/ page (docs/reference.md for
// the interface) that holds it. Guards against citations of the outside specification
// a newcomer could not follow.
func TestRepository_NothingCitesAFileOutsideIt(t *testing.T) {
	t.Parallel()
	var found []string
	for _, rel := range repoFiles(t) {
		if !citesOutsideChecked(rel) {
			continue
		}
		for i, line := range repoLines(t, rel) {
			if outsideRef.MatchString(line) {
				found = append(found, fmt.Sprintf("%s:%d: %s", rel, i+1, strings.TrimSpace(line)))
			}
		}
	}
	require.Empty(t, found, "state the rule, or cite the docs/ page that holds it (docs/reference.md for the interface)")
}

// citesOutsideChecked says whether the repository's file rel is one a reader reads:
// code, SQL, docs, deploy files; not test data or build outputs.
func citesOutsideChecked(rel string) bool {
	if strings.Contains(rel, "testdata/") || strings.HasPrefix(rel, "bin/") {
		return false
	}
	for _, ext := range []string{".go", ".sql", ".md", ".yaml", ".yml", ".sh", "Makefile"} {
		if strings.HasSuffix(rel, ext) {
			return true
		}
	}
	return false
}

// earlyExit is a pipe into a reader that may stop before its writer has finished:
// grep -q or -m, or head.
var earlyExit = regexp.MustCompile(`\|\s*(grep\s+-[A-Za-z]*[qm]|head\b)`)

// Under pipefail, a pipe into a reader that exits early fails when its writer is
// still writing: the writer dies of SIGPIPE (141) and the pipeline takes its status.
// No script that sets pipefail has such a pipe, unless its line says `|| true`.
// Guards against the image smoke test's `docker logs | grep -q`, which failed a CI
// run on a log that did say what it looked for.
func TestScripts_UnderPipefailNoPipeEndsInAReaderThatStopsEarly(t *testing.T) {
	t.Parallel()
	// The failure itself: grep -q matches the first line and exits, seq is still
	// writing, and the pipeline fails with seq's SIGPIPE.
	out, err := exec.Command("bash", "-c", `set -o pipefail; seq 1 1000000 | grep -q '^1$'`).CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	require.Equal(t, 141, exit.ExitCode())

	var found []string
	for _, rel := range repoFiles(t) {
		if strings.HasPrefix(rel, "bin/") {
			continue
		}
		lines := repoLines(t, rel)
		if !strings.Contains(strings.Join(lines, "\n"), "pipefail") || !shellScript(rel, lines) {
			continue
		}
		for i, line := range lines {
			code := strings.TrimSpace(line)
			if strings.HasPrefix(code, "#") || strings.Contains(code, "|| true") {
				continue
			}
			if earlyExit.MatchString(code) {
				found = append(found, fmt.Sprintf("%s:%d: %s", rel, i+1, code))
			}
		}
	}
	require.Empty(t, found, "read the writer's output whole, then search it")
}

// shellScript says whether the repository's file rel is a shell script or a Makefile.
func shellScript(rel string, lines []string) bool {
	return strings.HasSuffix(rel, ".sh") || rel == "Makefile" ||
		(len(lines) > 0 && strings.HasPrefix(lines[0], "#!") && strings.Contains(lines[0], "sh"))
}
