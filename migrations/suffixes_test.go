package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
)

// suffixesSQLBody is certworker_suffixes as a SQL function, its body before it became
// PL/pgSQL: what the new body must answer alike, and what BenchmarkSuffixes compares
// it with.
const suffixesSQLBody = `CREATE FUNCTION pg_temp.suffixes_sql(p_name text) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT COALESCE(array_agg(array_to_string(l[i:], '.') ORDER BY i), '{}')
    FROM (SELECT string_to_array(lower(p_name), '.') AS l) s,
         generate_series(1, GREATEST(cardinality(l) - 1, 0)) AS i
$$`

// certworker_suffixes is every suffix of two labels or more, the name first, in lower
// case; nothing for NULL, an empty name or one label. Odd names (a trailing or leading
// dot, an empty label) are split as they stand, as the SQL body of old split them.
func TestSuffixes_EverySuffixOfTwoLabelsOrMore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, pgtest.NewDB(t))
	_, err := conn.Exec(ctx, suffixesSQLBody)
	require.NoError(t, err)
	for _, c := range []struct {
		name any // a string, or nil for NULL
		want []string
	}{
		{"Shop.Tenant.Example.co.uk", []string{"shop.tenant.example.co.uk", "tenant.example.co.uk", "example.co.uk", "co.uk"}},
		{"example.com", []string{"example.com"}},
		{"com", []string{}},
		{"", []string{}},
		{nil, []string{}},
		{"example.com.", []string{"example.com.", "com."}},
		{".example.com", []string{".example.com", "example.com"}},
		{"a..example.com", []string{"a..example.com", ".example.com", "example.com"}},
		{"*.Wild.example", []string{"*.wild.example", "wild.example"}},
		{".", []string{"."}},
	} {
		var got, old []string
		require.NoError(t, conn.QueryRow(ctx, `SELECT certworker_suffixes($1), pg_temp.suffixes_sql($1)`, c.name).Scan(&got, &old))
		require.Equal(t, c.want, got, "certworker_suffixes(%v)", c.name)
		require.Equal(t, old, got, "certworker_suffixes(%v) differs from the SQL body of old", c.name)
	}
}

// BenchmarkSuffixes: certworker_suffixes against its SQL body of old, side by side on
// one session, over the same 20,000 names of four labels (the claim calls it once for
// each row it reads). Reports µs per name.
func BenchmarkSuffixes(b *testing.B) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.NewDB(b))
	require.NoError(b, err)
	b.Cleanup(func() { conn.Close(ctx) })
	_, err = conn.Exec(ctx, suffixesSQLBody)
	require.NoError(b, err)
	const names = 20000
	for _, f := range []string{"certworker_suffixes", "pg_temp.suffixes_sql"} {
		b.Run(f, func(b *testing.B) {
			for b.Loop() {
				var n int
				require.NoError(b, conn.QueryRow(ctx, `SELECT count(`+f+`('www.t' || g || '.example.com'))
FROM generate_series(1, $1::int) g`, names).Scan(&n))
				require.Equal(b, names, n)
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*names), "µs/name")
		})
	}
}
