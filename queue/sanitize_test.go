package queue_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// sanitizeCases are texts a CA, a DNS answer or a Go error can put in front of the
// sanitiser, with what is stored.
var sanitizeCases = []struct {
	name, in, want string
}{
	{"plain", "acme: urn:ietf:params:acme:error:dns: NXDOMAIN looking up A", "acme: urn:ietf:params:acme:error:dns: NXDOMAIN looking up A"},
	{"nul", "bad\x00detail", "baddetail"},
	{"invalid utf-8", "caf\xe9 \xff\xfe", `caf\xE9 \xFF\xFE`},
	{"newlines and tabs", "line one\nline two\r\n\tend", "line one line two   end"},
	{"c0, del and c1", "a\x01b\x1bc[31md\x7fe\u0085f\u009bg", "abc[31mdefg"},
	{"bidi override", "evil\u202ecod.exe\u2066x\u2069", "evilcod.exex"},
	{"line separator", "a\u2028b\u2029c", "abc"},
	{"kept unicode", "Zürich €5 日本", "Zürich €5 日本"},
	{"truncated surrogate bytes", "\xed\xa0\x80", `\xED\xA0\x80`},
}

func TestSanitizeError_StoresWhatTheDatabaseAcceptsAndTheTenantMayRead(t *testing.T) {
	t.Parallel()
	for _, tc := range sanitizeCases {
		require.Equal(t, tc.want, queue.SanitizeError(tc.in), tc.name)
	}
}

// A CA's detail of any length is cut to the bound, on a character boundary, and
// says it was cut.
func TestSanitizeError_BoundsTheLengthOnACharacterBoundary(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", queue.MaxErrorBytes) // two bytes each
	got := queue.SanitizeError(long)
	require.LessOrEqual(t, len(got), queue.MaxErrorBytes)
	require.True(t, utf8.ValidString(got))
	require.True(t, strings.HasSuffix(got, "..."))
	require.Greater(t, len(got), queue.MaxErrorBytes-8, "cut far shorter than the bound")

	exact := strings.Repeat("a", queue.MaxErrorBytes)
	require.Equal(t, exact, queue.SanitizeError(exact), "a text at the bound was cut")
	// Escapes grow the text; the bound is on what is stored.
	escaped := queue.SanitizeError(strings.Repeat("\xff", queue.MaxErrorBytes))
	require.LessOrEqual(t, len(escaped), queue.MaxErrorBytes)
}

func FuzzSanitizeError(f *testing.F) {
	for _, tc := range sanitizeCases {
		f.Add(tc.in)
	}
	f.Add(strings.Repeat("\x00é\xff", 700))
	f.Fuzz(func(t *testing.T, in string) {
		got := queue.SanitizeError(in)
		if !utf8.ValidString(got) {
			t.Fatalf("SanitizeError(%q) = %q, not valid UTF-8", in, got)
		}
		if len(got) > queue.MaxErrorBytes {
			t.Fatalf("SanitizeError(%q) is %d bytes", in, len(got))
		}
		for _, r := range got {
			if r < 0x20 || r >= 0x7f && r <= 0x9f || r == 0x202e || r == 0x2028 {
				t.Fatalf("SanitizeError(%q) = %q holds control character %U", in, got, r)
			}
		}
		if again := queue.SanitizeError(got); again != got {
			t.Fatalf("SanitizeError is not idempotent: %q then %q", got, again)
		}
		if utf8.ValidString(in) && len(in) <= queue.MaxErrorBytes && !strings.ContainsFunc(in, func(r rune) bool {
			return r < 0x20 || r >= 0x7f && r <= 0x9f || r >= 0x2000
		}) && got != in {
			t.Fatalf("SanitizeError(%q) = %q changed a clean text", in, got)
		}
	})
}

// Every case, as stored: the failure write takes each (a NUL or an invalid byte was
// 22021, and the write was retried for ever), and the row holds the sanitised text.
func TestMarkFailed_StoresAnyReasonSanitised(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	for _, tc := range sanitizeCases {
		id, _ := b.domain(t, tn, "pending", 0, nil)
		c := b.claimOne(t, id)
		_, err := b.q.MarkFailed(b.ctx, c, tc.in)
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.want, *b.sslRow(t, id).Error, tc.name)
	}
}

// A database whose server encoding is not UTF8 (LATIN1 here) cannot hold every
// character. A session with client_encoding UTF8 (set in a connection string, or by
// PGCLIENTENCODING) has "€" refused (22P05), and with it the whole failure write; a
// session left on the database's encoding stores the bytes as other characters, and
// the tenant reads mojibake. The queue reads the encoding once and writes every
// character outside ASCII as \u{XXXX}, which reads back the same in any session:
// simpler than knowing each encoding's repertoire, and loses nothing a tenant needs.
func TestErrorText_EscapesWhatTheServerEncodingCannotHold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := pgtest.Shared(t)
	admin, err := pgx.Connect(ctx, srv.AdminURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	name := "latin1_" + strings.ReplaceAll(uuid.NewString(), "-", "")
	_, err = admin.Exec(ctx, `CREATE DATABASE `+name+` TEMPLATE template0 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C'`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`) })
	for _, clientEncoding := range []string{"", "UTF8"} {
		cfg, err := pgx.ParseConfig(srv.URL(name))
		require.NoError(t, err)
		if clientEncoding != "" {
			cfg.RuntimeParams["client_encoding"] = clientEncoding
		}
		conn, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS t (v text)`)
		require.NoError(t, err)
		if clientEncoding == "UTF8" {
			_, err = conn.Exec(ctx, `INSERT INTO t VALUES ($1)`, "€")
			var pg *pgconn.PgError
			require.True(t, errors.As(err, &pg), "LATIN1 took a euro sign: the test does not test what it says (%v)", err)
			require.Equal(t, "22P05", pg.Code)
		}

		got := queue.ErrorTextForTest(ctx, queue.New(conn, issuing.DefaultConfig()), "Zürich €5 日本 \x00\xff")
		require.Equal(t, `Z\u{00FC}rich \u{20AC}5 \u{65E5}\u{672C} \xFF`, got)
		var back string
		require.NoError(t, conn.QueryRow(ctx, `INSERT INTO t VALUES ($1) RETURNING v`, got).Scan(&back))
		require.Equal(t, got, back, "client_encoding %q", clientEncoding)
	}
}
