package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
)

// servedRow is a row of certworker_certificate_for.
type servedRow struct {
	Domain, CertificatePEM, PrivateKeyPEM string
	ExpiresAt                             *time.Time
	Version                               int64
}

// certificateFor asks certworker_certificate_for(name) on conn: nil for no row.
func certificateFor(t *testing.T, conn *pgx.Conn, name string) *servedRow {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT domain, certificate_pem, private_key_pem, expires_at, version
FROM certworker_certificate_for($1)`, name)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (servedRow, error) {
		var s servedRow
		err := r.Scan(&s.Domain, &s.CertificatePEM, &s.PrivateKeyPEM, &s.ExpiresAt, &s.Version)
		if s.ExpiresAt != nil {
			at := s.ExpiresAt.UTC()
			s.ExpiresAt = &at
		}
		return s, err
	})
	require.NoError(t, err)
	require.LessOrEqual(t, len(got), 1, "certworker_certificate_for(%q) returned %d rows", name, len(got))
	if len(got) == 0 {
		return nil
	}
	return &got[0]
}

// servingFixture fills a database with the cases of the serving rule, for tenants a
// and b. Each certificate's PEM and key name the row they were stored under, so a
// test sees which row was served.
const servingFixture = `
INSERT INTO proxy_tenants (id, name, slug, email) VALUES
    ('00000000-0000-0000-0000-00000000000a', 'a', 'a', 'a@example.com'),
    ('00000000-0000-0000-0000-00000000000b', 'b', 'b', 'b@example.com');
CREATE FUNCTION pg_temp.add_domain(tenant text, name text, verification text, provider text) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_provider, ssl_status)
    VALUES (('00000000-0000-0000-0000-00000000000' || tenant)::uuid, name, verification, 'tok', provider, 'active')
$$;
CREATE FUNCTION pg_temp.add_cert(name text, expires timestamptz) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at)
    VALUES (name, 'chain of ' || name, 'key of ' || name, expires)
$$;
SELECT pg_temp.add_domain('a', 'shop.example', 'verified', 'acme'), pg_temp.add_cert('shop.example', '2030-01-01Z');
-- Case twins. An unverified twin of another tenant's, holding a certificate, stops
-- nothing; of two verified acme twins the one holding a certificate keeps the name;
-- of two that both hold one, the one verified first (inserted first here); two
-- verified uploads, neither acme, serve neither.
SELECT pg_temp.add_domain('a', 'held.example', 'verified', 'acme'), pg_temp.add_cert('held.example', '2030-01-02Z');
SELECT pg_temp.add_domain('b', 'HELD.example', 'pending', 'acme'), pg_temp.add_cert('HELD.example', '2030-01-03Z');
SELECT pg_temp.add_domain('a', 'kept.example', 'verified', 'acme');
SELECT pg_temp.add_domain('b', 'KEPT.example', 'verified', 'acme'), pg_temp.add_cert('KEPT.example', '2030-01-04Z');
SELECT pg_temp.add_domain('b', 'First.example', 'verified', 'acme'), pg_temp.add_cert('First.example', '2030-01-05Z');
SELECT pg_temp.add_domain('a', 'first.example', 'verified', 'acme'), pg_temp.add_cert('first.example', '2030-01-06Z');
SELECT pg_temp.add_domain('a', 'twice.example', 'verified', 'manual'), pg_temp.add_cert('twice.example', '2030-01-07Z');
SELECT pg_temp.add_domain('b', 'TWICE.example', 'verified', 'manual'), pg_temp.add_cert('TWICE.example', '2030-01-08Z');
-- A verified acme row beside a verified upload of the same name: the acme row's.
SELECT pg_temp.add_domain('a', 'mixed.example', 'verified', 'acme'), pg_temp.add_cert('mixed.example', '2030-01-09Z');
SELECT pg_temp.add_domain('b', 'MIXED.example', 'verified', 'manual'), pg_temp.add_cert('MIXED.example', '2030-01-10Z');
-- A wildcard, and names under it: one with a verified row of its own and no
-- certificate (another tenant's), one with an unverified row of its own.
SELECT pg_temp.add_domain('a', '*.wild.example', 'verified', 'acme'), pg_temp.add_cert('*.wild.example', '2030-02-01Z');
SELECT pg_temp.add_domain('b', 'taken.wild.example', 'verified', 'acme');
SELECT pg_temp.add_domain('b', 'pending.wild.example', 'pending', 'acme');
SELECT pg_temp.add_domain('a', 'own.wild.example', 'verified', 'acme'), pg_temp.add_cert('own.wild.example', '2030-02-02Z');
-- A wildcard stored under a name in upper case.
SELECT pg_temp.add_domain('a', '*.UPPER.example', 'verified', 'acme'), pg_temp.add_cert('*.UPPER.example', '2030-02-03Z');
-- A wildcard that is not verified serves nothing.
SELECT pg_temp.add_domain('a', '*.unverified.example', 'pending', 'acme'), pg_temp.add_cert('*.unverified.example', '2030-02-04Z');
-- A certificate the operator uploaded by hand: a manual row, a PEM key, no expiry
-- recorded.
SELECT pg_temp.add_domain('a', 'manual.example', 'verified', 'manual'), pg_temp.add_cert('manual.example', NULL);
UPDATE proxy_certificates SET private_key_pem = '-----BEGIN PRIVATE KEY-----' WHERE domain = 'manual.example';
-- Not served: unverified with a certificate, verified without one.
SELECT pg_temp.add_domain('a', 'unverified.example', 'pending', 'acme'), pg_temp.add_cert('unverified.example', '2030-03-01Z');
SELECT pg_temp.add_domain('a', 'nocert.example', 'verified', 'acme');
-- A row nobody has written since versions began (the reference's): version 0.
SELECT pg_temp.add_domain('a', 'legacy.example', 'verified', 'acme'), pg_temp.add_cert('legacy.example', '2030-04-01Z');
UPDATE proxy_certificates SET version = NULL WHERE domain = 'legacy.example';`

// servingDB is a connection to a fresh database holding servingFixture, then more.
func servingDB(t *testing.T, more string) *pgx.Conn {
	t.Helper()
	conn := connect(t, pgtest.NewDB(t))
	_, err := conn.Exec(context.Background(), servingFixture+more)
	require.NoError(t, err)
	return conn
}

// certificateFor answers for a TLS server name by the case-twin and wildcard rules:
// which row's certificate is served, under which domain (the one its key is sealed
// to), with which version, or no row. Guards against the three readings of old (the
// proxy's query that ignored case twins and wildcards, the one that returned no
// version, and certstore's wildcard fallback in Go) drifting apart again, since every
// reader now asks this one function.
func TestCertificateFor_AnswersByTheCaseTwinAndWildcardRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := servingDB(t, "")
	versions := map[string]int64{}
	rows, err := conn.Query(ctx, `SELECT domain, COALESCE(version, -1) FROM proxy_certificates`)
	require.NoError(t, err)
	var d string
	var v int64
	_, err = pgx.ForEachRow(rows, []any{&d, &v}, func() error { versions[d] = v; return nil })
	require.NoError(t, err)

	date := func(s string) *time.Time {
		at, err := time.Parse(time.DateOnly, s)
		require.NoError(t, err)
		return &at
	}
	// served is the row certworker_certificate_for returns for the certificate stored
	// under stored, whose domain in lower case is domain.
	served := func(stored, domain, expires string) *servedRow {
		r := &servedRow{Domain: domain, CertificatePEM: "chain of " + stored, PrivateKeyPEM: "key of " + stored, Version: versions[stored]}
		if expires != "" {
			r.ExpiresAt = date(expires)
		}
		require.Positive(t, r.Version, "the trigger drew no version for %s", stored)
		return r
	}
	manual := served("manual.example", "manual.example", "")
	manual.PrivateKeyPEM = "-----BEGIN PRIVATE KEY-----"
	legacy := &servedRow{Domain: "legacy.example", CertificatePEM: "chain of legacy.example", PrivateKeyPEM: "key of legacy.example",
		ExpiresAt: date("2030-04-01"), Version: 0}
	require.Equal(t, int64(-1), versions["legacy.example"], "the fixture's version was not cleared")

	for _, tc := range []struct {
		name, why string
		want      *servedRow
	}{
		{"shop.example", "a plain name", served("shop.example", "shop.example", "2030-01-01")},
		{"SHOP.Example.", "upper case and a trailing dot are ignored", served("shop.example", "shop.example", "2030-01-01")},
		{"shop.example.", "a trailing dot", served("shop.example", "shop.example", "2030-01-01")},
		{"shop.example..", "only one trailing dot is a name's", nil},
		{"held.example", "an unverified twin holding a certificate stops nothing", served("held.example", "held.example", "2030-01-02")},
		{"kept.example", "of verified acme twins the one holding a certificate keeps the name", served("KEPT.example", "kept.example", "2030-01-04")},
		{"first.example", "of verified acme twins both holding one, the one verified first", served("First.example", "first.example", "2030-01-05")},
		{"twice.example", "two verified uploads of one name: neither", nil},
		{"mixed.example", "a verified acme row beside a verified upload: the acme row's", served("mixed.example", "mixed.example", "2030-01-09")},
		{"www.wild.example", "a name one label below a wildcard's base", served("*.wild.example", "*.wild.example", "2030-02-01")},
		{"WWW.Wild.Example.", "the same in upper case with a trailing dot", served("*.wild.example", "*.wild.example", "2030-02-01")},
		{"pending.wild.example", "an unverified row of its own does not hold the wildcard back", served("*.wild.example", "*.wild.example", "2030-02-01")},
		{"taken.wild.example", "a verified row of its own (another tenant's) and no certificate", nil},
		{"own.wild.example", "a verified row of its own with a certificate: its own", served("own.wild.example", "own.wild.example", "2030-02-02")},
		{"a.b.wild.example", "two labels below the base", nil},
		{"wild.example", "the base of a wildcard with no row of its own", nil},
		{"*.wild.example", "the wildcard's own name is its row", served("*.wild.example", "*.wild.example", "2030-02-01")},
		{"x.upper.example", "a wildcard stored in upper case, its domain in lower case", served("*.UPPER.example", "*.upper.example", "2030-02-03")},
		{"x.unverified.example", "a wildcard that is not verified", nil},
		{"manual.example", "a certificate uploaded by hand, with a PEM key and no expiry", manual},
		{"unverified.example", "unverified, with a certificate", nil},
		{"nocert.example", "verified, without a certificate", nil},
		{"legacy.example", "a row with no version counts as 0", legacy},
		{"unknown.example", "no row at all", nil},
		{"example", "one label", nil},
		{"", "empty", nil},
	} {
		require.Equal(t, tc.want, certificateFor(t, conn, tc.name), "%q: %s", tc.name, tc.why)
	}
	var null int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM certworker_certificate_for(NULL)`).Scan(&null))
	require.Zero(t, null, "NULL")
}

// Each write of a served certificate changes the version the function returns, and
// bookkeeping of the worker's (renew_at) does not: a reader that skips a certificate
// whose version it holds misses no change, and reloads nothing that did not change.
func TestCertificateFor_VersionMovesWithTheCertificateOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := servingDB(t, "")
	before := certificateFor(t, conn, "www.wild.example")
	require.NotNil(t, before)

	_, err := conn.Exec(ctx, `UPDATE proxy_certificates SET renew_at = now() WHERE domain = '*.wild.example'`)
	require.NoError(t, err)
	require.Equal(t, before, certificateFor(t, conn, "www.wild.example"), "bookkeeping moved the version")

	for _, change := range []string{
		`UPDATE proxy_certificates SET certificate_pem = 'chain, renewed' WHERE domain = '*.wild.example'`,
		`UPDATE proxy_certificates SET private_key_pem = 'key, re-sealed' WHERE domain = '*.wild.example'`,
	} {
		_, err = conn.Exec(ctx, change)
		require.NoError(t, err)
		after := certificateFor(t, conn, "www.wild.example")
		require.NotNil(t, after)
		require.Greater(t, after.Version, before.Version, change)
		before = after
	}
}

// The function is inlined into the statement that calls it and reads through the
// index on lower(domain), in the generic plan a proxy's prepared statement gets too:
// at a million domains a scan of proxy_domains per handshake would take the proxy
// down. Guards against a change that stops the inlining (STRICT, a SET clause,
// SECURITY DEFINER, VOLATILE), which shows as a Function Scan and hides the plan, and
// against a condition the index cannot serve (a lower() of the other side, say).
func TestCertificateFor_ReadsThroughTheIndexOnTheLoweredName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := servingDB(t, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_provider, ssl_status)
SELECT '00000000-0000-0000-0000-00000000000a', 'n' || i || '.bulk.example', 'verified', 'tok', 'acme', 'active'
FROM generate_series(1, 20000) i;
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem)
SELECT 'n' || i || '.bulk.example', 'chain', 'key' FROM generate_series(1, 20000) i;
ANALYZE proxy_domains; ANALYZE proxy_certificates`)

	var security, volatility string
	var strict bool
	var config []string
	require.NoError(t, conn.QueryRow(ctx, `SELECT CASE WHEN prosecdef THEN 'definer' ELSE 'invoker' END, provolatile::text, proisstrict, proconfig
FROM pg_proc WHERE oid = 'public.certworker_certificate_for(text)'::regprocedure`).Scan(&security, &volatility, &strict, &config))
	require.Equal(t, "invoker", security)
	require.Equal(t, "s", volatility, "STABLE")
	require.False(t, strict, "a STRICT function is not inlined")
	require.Empty(t, config, "a function with a SET clause is not inlined")

	_, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan;
PREPARE served(text) AS SELECT * FROM certworker_certificate_for($1)`)
	require.NoError(t, err)
	for _, name := range []string{"n17.bulk.example", "www.wild.example"} {
		nodes := pgtest.PlanNodes(t, conn, `EXECUTE served('`+name+`')`)
		require.Contains(t, nodes, pgtest.PlanNode{NodeType: "Index Scan", RelationName: "proxy_domains", IndexName: "proxy_domains_lower_domain_idx"}, "%s: %v", name, nodes)
		require.Contains(t, nodes, pgtest.PlanNode{NodeType: "Index Scan", RelationName: "proxy_certificates", IndexName: "proxy_certificates_domain_key"}, "%s: %v", name, nodes)
		for _, n := range nodes {
			require.NotEqual(t, "Function Scan", n.NodeType, "%s: the function was not inlined: %v", name, nodes)
			require.NotEqual(t, "Seq Scan", n.NodeType, "%s: %v", name, nodes)
		}
	}
}
