package deploy_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

// docsRoot is the repository's top directory, seen from deploy/ (where go test runs
// this package).
const docsRoot = ".."

// The README and every page of docs/ link only to files that exist and to headings
// those files have, so that a page moved or a heading renamed breaks the test, not
// a reader's click. Guards against the cross-references the move of the README into
// docs/ had to fix by hand ("see Profiles", "Benchmarks below").
func TestDocs_EveryRelativeLinkResolves(t *testing.T) {
	t.Parallel()
	pages := docPages(t, docsRoot)
	require.Contains(t, pages, "README.md")
	require.Contains(t, pages, "docs/runbook.md")
	require.Empty(t, brokenLinks(t, docsRoot, pages))
}

// docs/README.md is the index: it links to every other page of docs/, so a new page
// cannot be left out of it.
func TestDocs_IndexLinksEveryPage(t *testing.T) {
	t.Parallel()
	index := filepath.Join(docsRoot, "docs", "README.md")
	linked := map[string]bool{}
	for _, l := range markdownLinks(t, index) {
		if path, _, _ := strings.Cut(l.target, "#"); path != "" && !isURL(path) {
			linked[filepath.Clean(filepath.Join("docs", path))] = true
		}
	}
	for _, page := range docPages(t, docsRoot) {
		if strings.HasPrefix(page, "docs/") && page != "docs/README.md" {
			require.True(t, linked[filepath.FromSlash(page)], "docs/README.md does not link to %s", page)
		}
	}
}

// The checker itself finds each kind of broken link: a file that does not exist, a
// heading the target lacks (and one inside a code block, which is no heading), a
// duplicate's suffix beyond the duplicates, and a broken link in the same page; it
// passes links in code, to URLs, to headings as GitHub spells their anchors, and to
// files that are not Markdown. Guards against a checker that passes everything.
func TestDocs_LinkCheckerFindsBrokenLinks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600))
	}
	write("docs/b.md", "# Page B\n\n## The proxy's side\n\n## Wake-up source (`--wake`, `CERTWORKER_WAKE`)\n\n"+
		"## Twice\n\n## Twice\n\n```sh\n# Not a heading\n```\n")
	write("deploy/alerts.yaml", "groups: []\n")
	write("README.md", strings.Join([]string{
		"# Top",
		"[ok](docs/b.md) [ok](docs/b.md#the-proxys-side) [ok](docs/b.md#wake-up-source---wake-certworker_wake)",
		"[ok](docs/b.md#twice) [ok](docs/b.md#twice-1) [ok](deploy/alerts.yaml) [ok](#top) [ok](https://example.com/x.md#nope)",
		"`[in code](nowhere.md)`",
		"[good]: docs/b.md#twice",
		"[no file](docs/c.md) [no heading](docs/b.md#the-proxy-side) [code, not a heading](docs/b.md#not-a-heading)",
		"[one twin too many](docs/b.md#twice-2) [not here](#bottom)",
		"[ref]: docs/gone.md",
		"```",
		"[in a block](nowhere.md)",
		"```",
	}, "\n")+"\n")
	require.ElementsMatch(t, []string{
		"README.md: docs/c.md: no such file",
		"README.md: docs/b.md#the-proxy-side: docs/b.md has no heading with that anchor",
		"README.md: docs/b.md#not-a-heading: docs/b.md has no heading with that anchor",
		"README.md: docs/b.md#twice-2: docs/b.md has no heading with that anchor",
		"README.md: #bottom: README.md has no heading with that anchor",
		"README.md: docs/gone.md: no such file",
	}, brokenLinks(t, dir, []string{"README.md", "docs/b.md"}))
}

// GitHub's anchors: lower case, spaces to '-', punctuation other than '-' and '_'
// dropped, code and emphasis marks gone.
func TestDocs_AnchorsAreGitHubs(t *testing.T) {
	t.Parallel()
	for heading, anchor := range map[string]string{
		"Least privilege":                                 "least-privilege",
		"The proxy's side":                                "the-proxys-side",
		"Serving the certificates (for the proxy)":        "serving-the-certificates-for-the-proxy",
		"Wake-up source (`--wake`, `CERTWORKER_WAKE`)":    "wake-up-source---wake-certworker_wake",
		"CertworkerCAPaused":                              "certworkercapaused",
		"A **bold** [link](x.md) and *emphasis*":          "a-bold-link-and-emphasis",
		"Functions in the proxy's database":               "functions-in-the-proxys-database",
		"External account binding and CAA":                "external-account-binding-and-caa",
		"Renewal information (RFC 9773), 50/s at most ü.": "renewal-information-rfc-9773-50s-at-most-ü",
	} {
		require.Equal(t, anchor, githubAnchor(heading), heading)
	}
}

// runbookBase is where the alerts' runbook_url annotations find docs/runbook.md: the
// repository's web page of the default branch (deploy/alerts.yaml says how to
// change it).
const runbookBase = "https://github.com/certworker/certworker/blob/main/"

// Every alert's runbook_url annotation is runbookBase + docs/runbook.md#<its name in
// lower case>, and docs/runbook.md has that section: an operator paged at night lands
// on what to do. runbook_url is the annotation Alertmanager's integrations and the
// Prometheus Operator's runbooks link; a relative path (the old `runbook`) opens
// nothing from a page or a chat message.
func TestAlerts_RunbookLinksToTheAlertsSection(t *testing.T) {
	t.Parallel()
	anchors := headingAnchors(t, filepath.Join(docsRoot, "docs", "runbook.md"))
	n := 0
	for _, file := range []string{"alerts.yaml", "alerts_test.yaml"} {
		text := readText(t, file)
		require.NotRegexp(t, `(?m)^\s*runbook:`, text, "%s: a relative runbook annotation", file)
		for _, line := range strings.Split(text, "\n") {
			if _, link, ok := strings.Cut(line, "runbook_url: "); ok {
				path, anchor, _ := strings.Cut(strings.TrimPrefix(strings.TrimSpace(link), runbookBase), "#")
				require.Equal(t, "docs/runbook.md", path, "%s: %s", file, line)
				require.True(t, anchors[anchor], "%s: docs/runbook.md has no section #%s", file, anchor)
			}
		}
	}
	for _, group := range docs(t, "alerts.yaml")[0].get("groups").list() {
		for _, rule := range group.get("rules").list() {
			name := rule.get("alert").str()
			want := runbookBase + "docs/runbook.md#" + strings.ToLower(name)
			require.Equal(t, want, rule.get("annotations", "runbook_url").str(), "alert %s", name)
			n++
		}
	}
	require.GreaterOrEqual(t, n, 9, "the alerts of alerts.yaml")
}

// docPages lists README.md and docs/*.md, relative to root, with slashes.
func docPages(t *testing.T, root string) []string {
	t.Helper()
	pages := []string{"README.md"}
	found, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	for _, f := range found {
		rel, err := filepath.Rel(root, f)
		require.NoError(t, err)
		pages = append(pages, filepath.ToSlash(rel))
	}
	sort.Strings(pages[1:])
	return pages
}

func readText(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// link is one link of a Markdown page: its target as written.
type link struct{ target string }

var (
	fence       = regexp.MustCompile("^\\s*(```|~~~)")
	codeSpan    = regexp.MustCompile("`+[^`]*`+")
	inlineLink  = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	refLinkDef  = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*(\S+)`)
	headingLine = regexp.MustCompile(`^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	urlScheme   = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// markdownLines yields the lines of a page outside fenced code blocks.
func markdownLines(t *testing.T, path string) []string {
	t.Helper()
	var out []string
	inFence := false
	for _, line := range strings.Split(readText(t, path), "\n") {
		if fence.MatchString(line) {
			inFence = !inFence
			continue
		}
		if !inFence {
			out = append(out, line)
		}
	}
	return out
}

// markdownLinks lists a page's links (inline and reference definitions), leaving out
// code spans and fenced blocks.
func markdownLinks(t *testing.T, path string) []link {
	t.Helper()
	var out []link
	for _, line := range markdownLines(t, path) {
		if m := refLinkDef.FindStringSubmatch(line); m != nil {
			out = append(out, link{m[1]})
			continue
		}
		line = codeSpan.ReplaceAllString(line, "")
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			out = append(out, link{m[1]})
		}
	}
	return out
}

// headingAnchors is the set of anchors GitHub gives a page's headings: a heading's
// anchor, then -1, -2... for each later heading with the same one.
func headingAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	seen := map[string]int{}
	anchors := map[string]bool{}
	for _, line := range markdownLines(t, path) {
		m := headingLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		a := githubAnchor(m[2])
		if n := seen[a]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

var (
	mdLinkText = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	mdMarks    = strings.NewReplacer("`", "", "**", "", "*", "", "__", "")
)

// githubAnchor is the anchor GitHub gives a heading: its text as rendered (a link's
// text, no code or emphasis marks), in lower case, with spaces as '-' and every
// character but letters, digits, '-' and '_' dropped.
func githubAnchor(heading string) string {
	text := mdMarks.Replace(mdLinkText.ReplaceAllString(heading, "$1"))
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func isURL(target string) bool { return urlScheme.MatchString(target) }

// brokenLinks checks every relative link of the pages (paths relative to root): its
// file exists, and its #anchor, in a Markdown file, is one of that file's headings.
func brokenLinks(t *testing.T, root string, pages []string) []string {
	t.Helper()
	var broken []string
	for _, page := range pages {
		for _, l := range markdownLinks(t, filepath.Join(root, page)) {
			if isURL(l.target) {
				continue
			}
			path, anchor, _ := strings.Cut(l.target, "#")
			target := page
			if path != "" {
				target = filepath.ToSlash(filepath.Join(filepath.Dir(page), path))
				if _, err := os.Stat(filepath.Join(root, target)); err != nil {
					broken = append(broken, fmt.Sprintf("%s: %s: no such file", page, l.target))
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(target, ".md") && !headingAnchors(t, filepath.Join(root, target))[anchor] {
				broken = append(broken, fmt.Sprintf("%s: %s: %s has no heading with that anchor", page, l.target, target))
			}
		}
	}
	return broken
}
