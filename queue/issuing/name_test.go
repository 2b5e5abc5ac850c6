package issuing_test

import (
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/stretchr/testify/require"
)

var (
	label63 = strings.Repeat("a", 63)
	// 63 + 1 + 63 + 1 + 63 + 1 + 61 = 253, the longest name a CA issues for.
	name253 = label63 + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 61)
)

var checkNameCases = []struct {
	name string
	want string // "" when the name is refused
}{
	{"example.com", "example.com"},
	{"a.b.c.example", "a.b.c.example"},
	{"xn--bcher-kva.example", "xn--bcher-kva.example"},
	// The proxy may store what the tenant typed; the CA is asked in lower case.
	{"EXAMPLE.COM", "example.com"},
	{"Mixed-Case.Example", "mixed-case.example"},
	{"a1.example", "a1.example"},
	{"1a.example", "1a.example"},
	{"a-b.example", "a-b.example"},
	{label63 + ".example", label63 + ".example"},
	{name253, name253},
	// Special-use domains that test CAs issue for stay allowed.
	{"a.test", "a.test"},
	{"shop.example", "shop.example"},
	{"localhost.example", "localhost.example"},
	{"onion.example.com", "onion.example.com"},
	{"arpa.example", "arpa.example"},

	{"", ""},
	{"localhost", ""},
	{"example.com.", ""},
	{"*.example.com", ""},
	{"a..b", ""},
	{".example.com", ""},
	{"-a.example", ""},
	{"a-.example", ""},
	{"a_b.example", ""},
	{"bücher.example", ""},
	{"1.2.3.4", ""},
	{"1.2.3.010", ""},
	{"::1", ""},
	{"[::1]", ""},
	{"a.123", ""},
	{strings.Repeat("a", 64) + ".example", ""},
	{name253 + "d", ""},
	{"a b.example", ""},
	{"a.example\n", ""},
	{"a\x00.example", ""},
	// Special-use domains no public CA issues for.
	{"printer.local", ""},
	{"x.onion", ""},
	{"db.internal", ""},
	{"DB.Internal", ""},
	{"a.localhost", ""},
	{"a.b.invalid", ""},
	{"name.alt", ""},
	{"nas.home.arpa", ""},
	{"home.arpa", ""},
}

// Only names a public CA can issue are ordered. A name the CA
// refuses spends an order from a rate-limited budget shared by every domain, ten times
// over a day; a wildcard needs DNS-01, which this worker does not do; an IP address
// or a single label can never be validated; a Unicode name must be ordered as its
// A-label. Upper case is accepted and ordered in lower case.
func TestCheckName_AcceptsOnlyNamesAPublicCACanIssue(t *testing.T) {
	t.Parallel()
	for _, tc := range checkNameCases {
		got, err := issuing.CheckName(tc.name)
		if tc.want == "" {
			require.Error(t, err, "%q was accepted as %q", tc.name, got)
			require.Empty(t, got, "%q: a refused name came back non-empty", tc.name)
			require.NotEmpty(t, err.Error(), "%q: refused without a reason", tc.name)
			continue
		}
		require.NoError(t, err, "%q", tc.name)
		require.Equal(t, tc.want, got, "%q", tc.name)
	}
}

var labelRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

// Whatever the proxy stored, CheckName must not panic (the worker would die on one
// bad row, and again on every restart), and a name it accepts must be one the CA
// accepts: lower case, at most 253 characters, no trailing dot, at least two labels
// of 1 to 63 letters, digits or inner hyphens, and already in its final form
// (checking it again changes nothing), and not an IP address.
func FuzzCheckName(f *testing.F) {
	for _, tc := range checkNameCases {
		f.Add(tc.name)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := issuing.CheckName(in)
		if err != nil {
			if got != "" {
				t.Fatalf("CheckName(%q) refused the name but returned %q", in, got)
			}
			return
		}
		if got != strings.ToLower(got) {
			t.Fatalf("CheckName(%q) = %q, not lower case", in, got)
		}
		if !strings.EqualFold(got, in) {
			t.Fatalf("CheckName(%q) = %q, not the same name", in, got)
		}
		if len(got) > 253 {
			t.Fatalf("CheckName(%q) = %d characters", in, len(got))
		}
		if strings.HasSuffix(got, ".") {
			t.Fatalf("CheckName(%q) = %q, with a trailing dot", in, got)
		}
		labels := strings.Split(got, ".")
		if len(labels) < 2 {
			t.Fatalf("CheckName(%q) = %q, a single label", in, got)
		}
		for _, l := range labels {
			if len(l) < 1 || len(l) > 63 || !labelRE.MatchString(l) {
				t.Fatalf("CheckName(%q) = %q, with the label %q", in, got, l)
			}
		}
		if _, err := netip.ParseAddr(got); err == nil {
			t.Fatalf("CheckName(%q) = %q, an IP address", in, got)
		}
		again, err := issuing.CheckName(got)
		if err != nil || again != got {
			t.Fatalf("CheckName(%q) = %q, but CheckName(%q) = %q, %v", in, got, got, again, err)
		}
	})
}

// With --dns01-zone a first label "*" makes a wildcard, in lower case; anywhere else,
// under a base that is not a valid name, twice, or without DNS-01, it stays invalid. Guards against a wildcard ordered without DNS-01 (the CA would refuse
// it over HTTP-01) and against "*.com" or "a.*.example" reaching the CA.
func TestCheckNameFor_WildcardsOnlyWithDNS01AndOnlyAsTheFirstLabel(t *testing.T) {
	t.Parallel()
	got, err := issuing.CheckNameFor("*.Shop.Example", true)
	require.NoError(t, err)
	require.Equal(t, "*.shop.example", got)
	for _, bad := range []string{"*.com", "*.*.shop.example", "a.*.shop.example", "*", "*.", "*.shop.example.", "*.-x.example"} {
		_, err := issuing.CheckNameFor(bad, true)
		require.Error(t, err, bad)
	}
	_, err = issuing.CheckNameFor("*.shop.example", false)
	require.ErrorContains(t, err, "a wildcard")
	_, err = issuing.CheckName("*.shop.example")
	require.ErrorContains(t, err, "a wildcard")
}

// Names under special-use domains are refused with the domain named, wildcards
// included; .test and .example, which test CAs issue for, are not.
func TestCheckName_RefusesSpecialUseDomainsButNotTestOrExample(t *testing.T) {
	t.Parallel()
	for name, sfx := range map[string]string{
		"printer.local": ".local", "x.onion": ".onion", "db.internal": ".internal",
		"a.localhost": ".localhost", "a.invalid": ".invalid", "n.alt": ".alt", "nas.home.arpa": ".home.arpa",
	} {
		_, err := issuing.CheckName(name)
		require.ErrorContains(t, err, "under "+sfx+", a special-use domain", name)
		_, err = issuing.CheckNameFor("*."+name, true)
		require.ErrorContains(t, err, "special-use", "*."+name)
	}
	for _, ok := range []string{"a.test", "shop.example", "*.shop.test"} {
		_, err := issuing.CheckNameFor(ok, true)
		require.NoError(t, err, ok)
	}
}
