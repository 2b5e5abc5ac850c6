package main

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// shown is s as `status` prints it on the operator's terminal: control characters
// (C0, DEL, C1: an escape sequence can rewrite the screen, move the cursor, set the
// window title), the tab that would shift status's columns, Unicode's format
// characters (bidirectional overrides that reorder what is read, zero-width ones),
// and bytes that are not UTF-8 written as Go escapes (\x1b, \u202e), and a backslash
// as \\ so that an escape is never ambiguous. Names, errors and pause reasons are
// what a tenant controls, or quote it: hostile input. JSON output needs none of it:
// encoding/json escapes control characters itself.
func shown(s string) string {
	clean := true
	for _, r := range s {
		if needsEscape(r) || r == '\\' {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b.WriteString(`\x` + strconv.FormatUint(uint64(s[i])|0x100, 16)[1:])
		case r == '\\':
			b.WriteString(`\\`)
		case needsEscape(r):
			q := strconv.QuoteRuneToASCII(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// needsEscape: r would act on the terminal rather than be read (shown).
func needsEscape(r rune) bool {
	return r == utf8.RuneError || unicode.IsControl(r) || unicode.Is(unicode.Cf, r) ||
		r == '\u2028' || r == '\u2029'
}
