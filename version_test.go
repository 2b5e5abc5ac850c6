package certworker_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker"
)

// releaseHeading is a release entry of CHANGELOG.md as Keep a Changelog writes it:
// "## [1.2.3] - 2026-12-04".
var releaseHeading = regexp.MustCompile(`^## \[([^\]]+)\] - (\d{4}-\d{2}-\d{2})$`)

// topRelease is the version and date of the first release entry of a changelog,
// skipping [Unreleased].
func topRelease(changelog string) (version, date string, ok bool) {
	for _, line := range strings.Split(changelog, "\n") {
		if m := releaseHeading.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			return m[1], m[2], true
		}
	}
	return "", "", false
}

// CHANGELOG.md's top release entry is VERSION, dated, with its link at the foot, and
// VERSION is a semantic version. Guards against a release tagged from a VERSION the
// changelog does not describe, or a changelog entry for a version never set.
func TestVersion_IsTheChangelogsTopRelease(t *testing.T) {
	require.Regexp(t, `^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`, certworker.Version())
	b, err := os.ReadFile("CHANGELOG.md")
	require.NoError(t, err)
	version, date, ok := topRelease(string(b))
	require.True(t, ok, "CHANGELOG.md has no release entry (## [VERSION] - YYYY-MM-DD)")
	require.Equal(t, certworker.Version(), version, "CHANGELOG.md's top release entry is not VERSION")
	_, err = time.Parse(time.DateOnly, date)
	require.NoError(t, err, "the date of %s", version)
	require.Contains(t, string(b), "\n["+version+"]: ", "CHANGELOG.md has no link for [%s]", version)
}

// The check reads the first release entry, not [Unreleased], and finds none in a
// changelog without one.
func TestVersion_TopReleaseSkipsUnreleased(t *testing.T) {
	v, d, ok := topRelease("# Changelog\n\n## [Unreleased]\n\n- x\n\n## [1.2.0] - 2026-01-02\n\n## [1.1.0] - 2025-12-01\n")
	require.True(t, ok)
	require.Equal(t, "1.2.0", v)
	require.Equal(t, "2026-01-02", d)
	_, _, ok = topRelease("# Changelog\n\n## [Unreleased]\n\n## 1.2.0\n")
	require.False(t, ok)
}

// LICENSE is the Apache License 2.0, whole.
func TestLicense_IsApache2(t *testing.T) {
	b, err := os.ReadFile("LICENSE")
	require.NoError(t, err)
	s := string(b)
	require.Contains(t, s, "Apache License\n                           Version 2.0, January 2004")
	require.Contains(t, s, "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION")
	require.Contains(t, s, "END OF TERMS AND CONDITIONS")
	require.Contains(t, s, "APPENDIX: How to apply the Apache License to your work.")
}
