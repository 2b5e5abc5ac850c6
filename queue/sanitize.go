package queue

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"
)

// MaxErrorBytes bounds the text of ssl_error. A CA's problem document, a DNS answer or
// a Go error chain can be any length, and the proxy shows the value to its tenant in
// a form: a kilobyte holds every message certworker writes itself (the longest, a
// waiting-for-DNS note naming a few addresses, is a few hundred bytes) and a CA's
// detail of several sentences, and keeps a hostile answer from filling the row.
const MaxErrorBytes = 1024

// truncatedMark ends a text SanitizeError had to cut. ASCII, so that it fits any
// server encoding.
const truncatedMark = "..."

// SanitizeError is the text stored as ssl_error for s, whatever its source (a CA's
// problem, a DNS answer, a Go error): every write of ssl_error goes through it
// (Queue.errorText), and so does a pause's reason, which `status` shows beside it, so that no value can make the write fail (a NUL is SQLSTATE
// 22021, invalid UTF-8 22021 too, and the write would be retried for ever) or put
// what a terminal or a browser acts on in front of the tenant (no
// control characters). Its rules:
//   - tab, newline and carriage return become a space (a multi-line error keeps its
//     words apart); every other control character is dropped: C0 (NUL included),
//     DEL, C1, and the Unicode controls that change how text around them reads
//     (bidirectional overrides and isolates, line and paragraph separators);
//   - a byte that is not valid UTF-8 is written as \xNN, so what it was stays visible;
//   - the result is at most MaxErrorBytes bytes, cut on a character boundary and
//     ended with "...".
//
// It is idempotent: its own output passes through unchanged.
func SanitizeError(s string) string { return sanitize(s, false) }

// sanitize is SanitizeError; asciiOnly also writes every character outside ASCII as
// \u{XXXX}, for a database whose server encoding cannot hold them all (LATIN1, for
// one, has no "€"): PostgreSQL refuses such a character with 22P05, and every server
// encoding holds ASCII.
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

// cut shortens s, valid UTF-8, to at most n bytes (n at least the mark's length) on
// a character boundary, ending it with truncatedMark.
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

// clean reports whether s needs no change: short enough, valid UTF-8, and nothing
// sanitize replaces or drops.
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

// dropped is the characters sanitize leaves out (tab, newline and carriage return are
// replaced first): C0 controls, DEL, C1 controls, and the format characters that
// reorder or break the text around them.
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

// serverEncoding is what a Queue learned of its database's server encoding, read
// once (SHOW server_encoding): a pool's sessions all reach the same database.
type serverEncoding struct {
	mu sync.Mutex
	// known: asciiOnly has been read. Not set when the read failed: the write that
	// follows probably fails too, and the next one reads again.
	known     bool
	asciiOnly bool
}

// errorText is SanitizeError for this queue's database: with a server encoding other
// than UTF8 (or SQL_ASCII, which stores any byte but NUL), characters outside ASCII
// are escaped too. The encoding is read once; a failed read counts, for this one
// text, as an encoding that holds only ASCII.
func (q *Queue) errorText(ctx context.Context, s string) string {
	return sanitize(s, q.asciiOnly(ctx))
}

// sanitizeWithTail is sanitize for head, a space and tail, where tail (certworker's
// own words) must survive the bound: head is cut to leave it room. An empty head
// gives tail alone.
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
