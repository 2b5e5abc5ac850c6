package main

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// integrationPage is where the proxy's author reads what to send.
const integrationPage = "../../docs/proxy-integration.md"

// servingStatements are the SQL blocks of the page's "Serving the certificates", in
// order.
func servingStatements(t *testing.T) []string {
	t.Helper()
	page, err := os.ReadFile(integrationPage)
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(page), "\n## Serving the certificates\n")
	require.True(t, ok, "%s has no section \"Serving the certificates\"", integrationPage)
	section, _, _ = strings.Cut(section, "\n## ")
	var out []string
	for _, m := range regexp.MustCompile("(?s)```sql\n(.*?)```").FindAllStringSubmatch(section, -1) {
		out = append(out, m[1])
	}
	return out
}

// The statements the page tells a proxy to send run, as written, under the proxy's
// role of deploy/grants.sql, and answer as the page says: what to serve for a name
// (a wildcard's row, asked for in upper case with a trailing dot); the same with the
// domain and version held, which sends no certificate while they are unchanged; and
// the check after a reconnection, which returns the names whose answer changed.
// Guards against documentation a proxy in another language copies and that fails,
// or that quietly means something else.
func TestDocs_TheProxysServingStatementsRunAsWritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	stmts := servingStatements(t)
	require.Len(t, stmts, 3, "what to serve, the check of a certificate held, the check after a reconnection")
	proxy, version := proxyServingDB(t)

	var domain, chain, key string
	var expires *string
	var v int64
	require.NoError(t, proxy.QueryRow(ctx, stmts[0], "WWW.Shop.Example.").Scan(&domain, &chain, &key, &expires, &v))
	require.Equal(t, []any{"*.shop.example", "wildcard chain", "wildcard key", (*string)(nil), version["*.shop.example"]},
		[]any{domain, chain, key, expires, v})
	rows, err := proxy.Query(ctx, stmts[0], "shop.example")
	require.NoError(t, err)
	none, err := pgx.CollectRows(rows, pgx.RowToMap)
	require.NoError(t, err)
	require.Empty(t, none, "the base of a wildcard with no row of its own")

	var gotChain, gotKey *string
	require.NoError(t, proxy.QueryRow(ctx, stmts[1], "www.shop.example", "*.shop.example", version["*.shop.example"]).
		Scan(&domain, &v, &gotChain, &gotKey))
	require.Nil(t, gotChain, "the certificate held was sent again")
	require.Nil(t, gotKey, "the key held was sent again")
	require.NoError(t, proxy.QueryRow(ctx, stmts[1], "www.shop.example", "*.shop.example", version["*.shop.example"]-1).
		Scan(&domain, &v, &gotChain, &gotKey))
	require.Equal(t, []any{"wildcard chain", "wildcard key"}, []any{*gotChain, *gotKey}, "another version held")

	_, err = proxy.Exec(ctx, `UPDATE proxy_certificates SET certificate_pem = 'renewed' WHERE domain = 'own.example'`)
	require.NoError(t, err)
	rows, err = proxy.Query(ctx, stmts[2],
		[]string{"www.shop.example", "own.example", "gone.example"},
		[]string{"*.shop.example", "own.example", "gone.example"},
		[]int64{version["*.shop.example"], version["own.example"], 7})
	require.NoError(t, err)
	changed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"own.example", "gone.example"}, changed)
}
