package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
)

// The proxy's role of deploy/grants.sql: the proxy's own inserts, verifies, updates
// and deletes, and the tenant operations (SECURITY INVOKER), all work under it, and
// what they change of certworker's columns the BEFORE triggers change (a retry
// forgets a CA's refusal and a hold, a provider switch drops the claim, a profile set
// forgets the refused one); a write of certworker's own columns is refused (42501).
// Guards against a proxy role that may move a domain in line, end a claim or clear a
// CA's refusal by hand, and against tenant operations that stop working under a role
// without those rights.
func TestGrants_TheProxysRoleLeavesCertworkersColumnsToCertworker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	adminDSN, proxyDSN := proxyRoleDB(t)
	admin, err := pgx.Connect(ctx, adminDSN)
	require.NoError(t, err)
	defer admin.Close(ctx)
	proxy, err := pgx.Connect(ctx, proxyDSN)
	require.NoError(t, err)
	defer proxy.Close(ctx)

	var tenant string
	require.NoError(t, proxy.QueryRow(ctx, `INSERT INTO proxy_tenants (name, slug, email)
VALUES ('shop', 'shop', 'shop@example.com') RETURNING id::text`).Scan(&tenant))
	insert := func(name string) string {
		t.Helper()
		var id string
		require.NoError(t, proxy.QueryRow(ctx, `INSERT INTO proxy_domains (tenant_id, domain, verification_token)
VALUES ($1, $2, 'tok') RETURNING id::text`, tenant, name).Scan(&id))
		_, err := proxy.Exec(ctx, `UPDATE proxy_domains SET verification_status = 'verified', updated_at = now() WHERE id = $1`, id)
		require.NoError(t, err, "the proxy's verify")
		return id
	}
	retried, switched, profiled := insert("retried.example"), insert("switched.example"), insert("profiled.example")

	_, err = admin.Exec(ctx, `UPDATE proxy_domains SET ssl_status = 'failed', ssl_attempts = 10, ssl_error = 'caa',
    ssl_ca_refused = 'https://ca.invalid/dir', ssl_held = 'backoff' WHERE id = $1`, retried)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `UPDATE proxy_domains SET ssl_status = 'provisioning', ssl_claim_token = gen_random_uuid(),
    ssl_claimed_by = 'w', ssl_lease_expires_at = now() + interval '1 minute' WHERE id = $1`, switched)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `UPDATE proxy_domains SET ssl_profile_refused = 'gone' WHERE id = $1`, profiled)
	require.NoError(t, err)

	for _, op := range []struct{ sql, id string }{
		{`SELECT count(*) FROM certworker_queue_for_issuance($1, $2)`, retried},
		{`SELECT count(*) FROM certworker_update_domain($1, $2, NULL, 'manual')`, switched},
		{`SELECT count(*) FROM certworker_set_profile($1, $2, 'classic')`, profiled},
	} {
		var n int
		require.NoError(t, proxy.QueryRow(ctx, op.sql, op.id, tenant).Scan(&n), op.sql)
		require.Equal(t, 1, n, op.sql)
	}
	var refused, held, token, refusedProfile *string
	require.NoError(t, admin.QueryRow(ctx, `SELECT ssl_ca_refused, ssl_held FROM proxy_domains WHERE id = $1`, retried).Scan(&refused, &held))
	require.Nil(t, refused, "the proxy's retry did not forget the CA's refusal")
	require.Nil(t, held, "the proxy's retry did not lift the hold")
	require.NoError(t, admin.QueryRow(ctx, `SELECT ssl_claim_token::text FROM proxy_domains WHERE id = $1`, switched).Scan(&token))
	require.Nil(t, token, "a provider switched kept the claim")
	require.NoError(t, admin.QueryRow(ctx, `SELECT ssl_profile_refused FROM proxy_domains WHERE id = $1`, profiled).Scan(&refusedProfile))
	require.Nil(t, refusedProfile, "a profile set kept the refused one")

	// The proxy's own certificate upload, and its deletes.
	_, err = proxy.Exec(ctx, `INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem) VALUES ('switched.example', 'pem', 'key')`)
	require.NoError(t, err)
	_, err = proxy.Exec(ctx, `UPDATE proxy_certificates SET certificate_pem = 'pem2', updated_at = now() WHERE domain = 'switched.example'`)
	require.NoError(t, err)

	for _, stmt := range []string{
		`UPDATE proxy_domains SET ssl_queue_seq = 1`,
		`UPDATE proxy_domains SET ssl_queue_tier = 1`,
		`UPDATE proxy_domains SET ssl_held = NULL`,
		`UPDATE proxy_domains SET ssl_claim_token = NULL`,
		`UPDATE proxy_domains SET ssl_lease_expires_at = 'infinity'`,
		`UPDATE proxy_domains SET ssl_ca_refused = NULL`,
		`UPDATE proxy_domains SET ssl_eligible_at = now()`,
		`UPDATE proxy_certificates SET renew_at = now()`,
		`INSERT INTO proxy_domains (tenant_id, domain, verification_token, ssl_queue_seq) VALUES (gen_random_uuid(), 'x.example', 't', 1)`,
	} {
		_, err := proxy.Exec(ctx, stmt)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: want permission denied, got %v", stmt, err)
		require.Equal(t, "42501", pgErr.Code, "%s: %s", stmt, pgErr.Message)
	}
	_, err = proxy.Exec(ctx, `DELETE FROM proxy_domains WHERE id = $1`, profiled)
	require.NoError(t, err)
	_, err = proxy.Exec(ctx, `DELETE FROM proxy_certificates WHERE domain = 'switched.example'`)
	require.NoError(t, err)
}

// certworker_certificate_for works under the proxy's role of deploy/grants.sql, as
// the proxy calls it (a prepared statement, the name as the client sent it): the
// certificate the proxy uploaded, its key as stored and its version, also where
// PUBLIC may not execute functions. Guards against a function that reads a column or
// table the proxy's role may not read, and against a grant missing from
// deploy/grants.sql, either of which would fail every handshake of a proxy that
// serves through it.
func TestGrants_TheProxysRoleAsksWhatToServe(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	proxy, versions := proxyServingDB(t)
	var domain, chain, key string
	var served int64
	require.NoError(t, proxy.QueryRow(ctx, `SELECT domain, certificate_pem, private_key_pem, version FROM certworker_certificate_for($1)`,
		"WWW.shop.example.").Scan(&domain, &chain, &key, &served))
	require.Equal(t, []any{"*.shop.example", "wildcard chain", "wildcard key", versions["*.shop.example"]}, []any{domain, chain, key, served})
	var rows int
	require.NoError(t, proxy.QueryRow(ctx, `SELECT count(*) FROM certworker_certificate_for('shop.example')`).Scan(&rows))
	require.Zero(t, rows, "the base of a wildcard with no row of its own")
}

// certworker_name_seen works under the proxy's role of deploy/grants.sql, also where
// PUBLIC may not execute it: a handshake for a domain waiting for its DNS brings its
// check forward (true). The role may write only the two columns the function sets.
// Guards against a grant missing from deploy/grants.sql (every handshake of such a
// proxy would fail) and against one that lets the proxy write the rest of the state.
func TestGrants_TheProxysRoleReportsAHandshake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	adminDSN, proxyDSN := proxyRoleDB(t)
	execSQL(t, adminDSN, `REVOKE EXECUTE ON FUNCTION certworker_name_seen(text) FROM PUBLIC;
INSERT INTO proxy_tenants (name, slug, email) VALUES ('shop', 'shop', 'shop@example.com');
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_provider, ssl_status)
SELECT id, 'waiting.example', 'verified', 'tok', 'acme', 'pending' FROM proxy_tenants;
UPDATE proxy_domains SET ssl_held = 'dns';
INSERT INTO certworker_dns_state (domain_id, waiting_since, next_check_at)
SELECT id, now() - interval '1 day', now() + interval '1 hour' FROM proxy_domains`)
	proxy, err := pgx.Connect(ctx, proxyDSN)
	require.NoError(t, err)
	defer proxy.Close(ctx)
	var got bool
	require.NoError(t, proxy.QueryRow(ctx, `SELECT certworker_name_seen($1)`, "Waiting.Example.").Scan(&got))
	require.True(t, got)
	require.NoError(t, proxy.QueryRow(ctx, `SELECT certworker_name_seen('nobody.example')`).Scan(&got))
	require.False(t, got)
	_, err = proxy.Exec(ctx, `UPDATE certworker_dns_state SET waiting_since = now()`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42501", pgErr.Code, "the proxy's role wrote the wait's clock")
}

// proxyServingDB is a connection as the proxy's role (proxyRoleDB) to a database
// whose PUBLIC may not execute certworker_certificate_for, so that the role's own
// grant must do, holding the proxy's uploads for *.shop.example and own.example, and
// their versions.
func proxyServingDB(t *testing.T) (*pgx.Conn, map[string]int64) {
	t.Helper()
	ctx := context.Background()
	adminDSN, proxyDSN := proxyRoleDB(t)
	execSQL(t, adminDSN, `REVOKE EXECUTE ON FUNCTION certworker_certificate_for(text) FROM PUBLIC`)
	proxy, err := pgx.Connect(ctx, proxyDSN)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close(context.Background()) })
	_, err = proxy.Exec(ctx, `
WITH t AS (INSERT INTO proxy_tenants (name, slug, email) VALUES ('shop', 'shop', 'shop@example.com') RETURNING id)
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_provider)
SELECT id, d, 'verified', 'tok', 'manual' FROM t, unnest(ARRAY['*.shop.example', 'own.example']) AS d;
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem)
VALUES ('*.shop.example', 'wildcard chain', 'wildcard key'), ('own.example', 'own chain', 'own key')`)
	require.NoError(t, err)
	rows, err := proxy.Query(ctx, `SELECT domain, version FROM proxy_certificates`)
	require.NoError(t, err)
	versions := map[string]int64{}
	var d string
	var v int64
	_, err = pgx.ForEachRow(rows, []any{&d, &v}, func() error { versions[d] = v; return nil })
	require.NoError(t, err)
	require.Len(t, versions, 2)
	return proxy, versions
}

// proxyRoleDB is a migrated database and a role holding the proxy's section of
// deploy/grants.sql: the owner's DSN and the role's.
func proxyRoleDB(t *testing.T) (adminDSN, proxyDSN string) {
	t.Helper()
	adminDSN = pgtest.NewDB(t)
	role, proxyDSN := newRole(t, adminDSN, "proxy", "")
	_, proxySection := grantsSections(t)
	execSQL(t, adminDSN, strings.ReplaceAll(proxySection, `:"proxy_role"`, `"`+role+`"`))
	return adminDSN, proxyDSN
}

// certworker_domain_status, certworker_domain_events and
// certworker_domain_events_since work under the proxy's role of deploy/grants.sql,
// where PUBLIC may not execute them: a grant or a table right missing from
// deploy/grants.sql would fail every status page the proxy shows. The role may not
// write the history (it is the worker's).
func TestGrants_TheProxysRoleReadsADomainsStateAndHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	adminDSN, proxyDSN := proxyRoleDB(t)
	execSQL(t, adminDSN, `REVOKE EXECUTE ON FUNCTION certworker_domain_status(uuid, uuid),
    certworker_domain_events(uuid, uuid, integer), certworker_domain_events_since(uuid, bigint, integer) FROM PUBLIC`)
	proxy, err := pgx.Connect(ctx, proxyDSN)
	require.NoError(t, err)
	defer proxy.Close(ctx)
	var tenant, id string
	require.NoError(t, proxy.QueryRow(ctx, `INSERT INTO proxy_tenants (name, slug, email)
VALUES ('shop', 'shop', 'shop@example.com') RETURNING id::text`).Scan(&tenant))
	require.NoError(t, proxy.QueryRow(ctx, `INSERT INTO proxy_domains (tenant_id, domain, verification_token, verification_status)
VALUES ($1, 'shop.example', 'tok', 'verified') RETURNING id::text`, tenant).Scan(&id))
	execSQL(t, adminDSN, `SELECT certworker_domain_event('`+id+`', '`+tenant+`', 'claimed', NULL, NULL, now())`)

	var state string
	require.NoError(t, proxy.QueryRow(ctx, `SELECT state FROM certworker_domain_status($1, $2)`, id, tenant).Scan(&state))
	require.Equal(t, "queued", state)
	var event string
	require.NoError(t, proxy.QueryRow(ctx, `SELECT event FROM certworker_domain_events($1, $2, 10)`, id, tenant).Scan(&event))
	require.Equal(t, "claimed", event)
	require.NoError(t, proxy.QueryRow(ctx, `SELECT event FROM certworker_domain_events_since($1, 0, 10)`, tenant).Scan(&event))
	require.Equal(t, "claimed", event)

	_, err = proxy.Exec(ctx, `SELECT certworker_domain_event($1, $2, 'issued', NULL, NULL, now())`, id, tenant)
	var pg *pgconn.PgError
	require.True(t, errors.As(err, &pg), "the proxy's role writes no history: %v", err)
	require.Equal(t, "42501", pg.Code)
}
