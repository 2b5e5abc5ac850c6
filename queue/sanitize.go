package queue

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"
)

// MaxErrorBytes bounds ssl_error, which the tenant sees: room for any message of
// ours and a CA's detail, not for a hostile answer.
const MaxErrorBytes = 1024

// truncatedMark ends a text SanitizeError had to cut; ASCII, for any encoding.
const truncatedMark = "..."

// SanitizeError is the text stored as ssl_error (and a pause's reason) for s, so no
// value can make the write fail (a NUL or invalid UTF-8 is 22021, retried for ever)
// or put control characters before the tenant. Tab, newline and carriage return
// become a space; other control and bidirectional characters are dropped; invalid
// UTF-8 bytes become \xNN; the result is cut to MaxErrorBytes on a character boundary,
// ending "...". It is idempotent.
func SanitizeError(s string) string { return sanitize(s, false) }

// sanitize is SanitizeError; asciiOnly also escapes every non-ASCII character as
// \u{XXXX}, for a server encoding that cannot hold it (22P05).
func sanitize(s string, asciiOnly bool) string {
	if clean(s, asciiOnly) {
		return s
	}
	var b strings.Builder
	b.Grow(min(len(s), MaxErrorBytes))
	for i := 0; i < len(s) && b.Len() <= MaxErrorBytes; {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02X`, s[i])
		case r == '\t' || r == '\n' || r == '\r':
			b.WriteByte(' ')
		case dropped(r):
		case asciiOnly && r >= utf8.RuneSelf:
			fmt.Fprintf(&b, `\u{%04X}`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	out := b.String()
	if len(out) <= MaxErrorBytes {
		return out
	}
	return cut(out, MaxErrorBytes)
}

// cut shortens valid UTF-8 s to at most n bytes, ending it with truncatedMark.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := max(n-len(truncatedMark), 0)
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + truncatedMark
}

// clean reports whether s needs no change.
func clean(s string, asciiOnly bool) bool {
	if len(s) > MaxErrorBytes {
		return false
	}
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || r < 0x20 || dropped(r) || asciiOnly && r >= utf8.RuneSelf {
			return false
		}
		i += size
	}
	return true
}

// dropped is the characters sanitize leaves out: C0, DEL, C1, and format characters
// that reorder or break the text around them.
func dropped(r rune) bool {
	switch {
	case r < 0x20, r >= 0x7f && r <= 0x9f:
		return true
	case r == 0x2028, r == 0x2029: // line and paragraph separators
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069, r == 0x200e, r == 0x200f, r == 0x061c:
		return true // bidirectional embeddings, overrides, isolates and marks
	}
	return false
}

// serverEncoding is the database's server encoding, read once per Queue.
type serverEncoding struct {
	mu sync.Mutex
	// known: asciiOnly has been read; a failed read is tried again next time.
	known     bool
	asciiOnly bool
}

// errorText is SanitizeError for this queue's database: ASCII-only unless the
// encoding is UTF8 or SQL_ASCII (or when it could not be read).
func (q *Queue) errorText(ctx context.Context, s string) string {
	return sanitize(s, q.asciiOnly(ctx))
}

// sanitizeWithTail is sanitize for head, a space and tail, cutting head so tail
// survives.
func sanitizeWithTail(head, tail string, ascii bool) string {
	tail = sanitize(tail, ascii)
	head = sanitize(head, ascii)
	if head == "" {
		return tail
	}
	if room := MaxErrorBytes - len(tail) - 1; len(head) > room {
		head = cut(head, room)
	}
	return head + " " + tail
}

var asciiOnlySQL = `SHOW server_encoding`

func (q *Queue) asciiOnly(ctx context.Context) bool {
	q.enc.mu.Lock()
	defer q.enc.mu.Unlock()
	if q.enc.known {
		return q.enc.asciiOnly
	}
	var enc string
	if err := q.db.QueryRow(ctx, asciiOnlySQL).Scan(&enc); err != nil {
		return true
	}
	q.enc.known = true
	q.enc.asciiOnly = enc != "UTF8" && enc != "SQL_ASCII"
	return q.enc.asciiOnly
}
