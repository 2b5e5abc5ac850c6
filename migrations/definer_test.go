package migrations_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
)

// The SECURITY DEFINER functions run with the rights of the role that ran migrate,
// for whoever calls them or fires their triggers. These tests try, as an attacker
// would, to make such a function run code of the attacker's with those rights (issue
// 16), for every definer function the catalogue holds, so that one added later is
// tried too.
//
// The route is the temporary table: every role may create temporary objects, and
// PostgreSQL looks relations up in pg_temp FIRST unless the function's search_path
// names pg_temp (last). The attacker shadows every relation of schema public with a
// temporary one of the same name, whose code (a trigger, or a function a view calls)
// tells the attacker, by a notice, which role ran it and what it read of
// proxy_certificates.private_key_pem; and with a temporary sequence for each sequence.
// Then it reaches the function every way it can: by calling it, by attaching it as
// the trigger of a temporary table of its own, and, as the proxy, by the writes that
// fire its triggers (verifying a domain, storing a certificate).
//
// Before migration 00009 the function ran the attacker's trigger as the owner, which
// read the keys, and drew the certificate versions from the attacker's sequence.

// sentinelKey is the private key stored before the attack: a notice carrying it is a
// leak of a row the attacker may not read.
const sentinelKey = "sentinel-private-key-of-another-tenant"

// proxyGrants are the proxy's rights, for loginRole.
const proxyGrants = `GRANT SELECT, INSERT, UPDATE, DELETE ON proxy_tenants, proxy_domains, proxy_certificates TO %[1]s`

// attacker is one of the roles the attack is tried as.
type attacker struct {
	name string
	// proxy: the role holds the proxy's rights (SELECT, INSERT, UPDATE, DELETE on the
	// proxy's three tables), and fires the triggers by writing them.
	proxy bool
}

// Each definer function, reached by a role with no grants and by one with the proxy's
// rights, runs none of the attacker's code as another role and draws from none of its
// sequences; calling it or attaching it to a table of the attacker's is refused with
// SQLSTATE 42501; and the proxy's own writes, which fire its triggers, still work.
func TestDefinerFunctions_RunNoCodeOfTheCaller(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	adminURL := pgtest.NewDB(t)
	admin := connect(t, adminURL)
	rels, definers := catalogue(t, admin)
	require.NotEmpty(t, definers, "no SECURITY DEFINER function found: the test proves nothing")
	_, err := admin.Exec(ctx, `
WITH t AS (INSERT INTO proxy_tenants (name, slug, email) VALUES ('victim', 'victim', 'v@example.com') RETURNING id)
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token) SELECT id, 'victim.example', 'verified', 'tok' FROM t;
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem) VALUES ('victim.example', 'pem', '`+sentinelKey+`')`)
	require.NoError(t, err)

	roles := []attacker{
		{name: loginRole(t, admin, adminURL, ""), proxy: false},
		{name: loginRole(t, admin, adminURL, proxyGrants+`;
ALTER ROLE %[1]s SET track_functions = 'all'`), proxy: true},
	}
	// One round shadows every relation with a table; then one round per relation
	// shadows it alone with a view. A view catches reads, but a function that
	// upserts into a view fails before it reads anything else, so the views are
	// tried one at a time.
	rounds := []string{"tables"}
	for _, r := range rels {
		if r.kind != "S" {
			rounds = append(rounds, "view "+r.name)
		}
	}
	for _, role := range roles {
		for _, round := range rounds {
			for _, f := range definers {
				t.Run(fmt.Sprintf("%s/%s/%s", roleKind(role), round, f.sig), func(t *testing.T) {
					a := startAttack(t, roleURL(t, adminURL, role.name), rels, round)
					err := a.reach(t, f)
					a.requireNoLeak(t, role.name)
					var pgErr *pgconn.PgError
					require.True(t, errors.As(err, &pgErr), "%s: want SQLSTATE 42501 (permission denied), got %v", f.sig, err)
					require.Equal(t, "42501", pgErr.Code, "%s: %s", f.sig, pgErr.Message)
				})
			}
			if !role.proxy {
				continue
			}
			t.Run(fmt.Sprintf("%s/%s/the proxy's writes", roleKind(role), round), func(t *testing.T) {
				a := startAttack(t, roleURL(t, adminURL, role.name), rels, round)
				failed, fired := a.proxyWrites(t)
				a.requireNoLeak(t, role.name)
				require.Empty(t, failed, "the proxy's own writes must keep working")
				for _, f := range definers {
					for _, table := range f.triggerTables {
						if strings.HasPrefix(table, "proxy_") {
							assert.Positive(t, fired[f.name],
								"%s is a trigger of %s, and none of the proxy's writes here fired it: add one to proxyWrites, so that the proxy's route to it is tried", f.sig, table)
						}
					}
				}
			})
		}
	}
}

// On PostgreSQL 13 and 14 every role may create objects in schema public unless the
// operator revoked it: a function named there with the parameter type an untyped
// literal prefers (text) wins over the built-in. The certificate trigger's
// nextval('...') took the proxy's public.nextval(text), which ran as the owner.
func TestDefinerFunctions_IgnoreOverloadsPlantedInSchemaPublic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	adminURL := pgtest.NewDB(t)
	admin := connect(t, adminURL)
	_, err := admin.Exec(ctx, `
GRANT CREATE ON SCHEMA public TO PUBLIC; -- PostgreSQL 13 and 14 as installed
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem) VALUES ('victim.example', 'pem', '`+sentinelKey+`')`)
	require.NoError(t, err)
	proxy := loginRole(t, admin, adminURL, proxyGrants)

	a := startAttack(t, roleURL(t, adminURL, proxy), nil, "")
	_, err = a.conn.Exec(ctx, `
CREATE FUNCTION public.nextval(text) RETURNS bigint LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM pg_temp.steal();
    RETURN 1;
END
$f$`)
	require.NoError(t, err)
	var version int64
	require.NoError(t, a.conn.QueryRow(ctx, `
INSERT INTO public.proxy_certificates (domain, certificate_pem, private_key_pem)
VALUES ('planted.example', 'pem', 'key') RETURNING version`).Scan(&version))
	a.requireNoLeak(t, proxy)
	require.NotEqual(t, int64(1), version, "the version came from the planted nextval")
}

// The same attack where the proxy's column is varchar, not text (a schema of its own
// making): for lower(varchar_column) a planted public.lower(varchar) is an exact match,
// and beats pg_catalog.lower(text), which needs a cast, whatever the search_path. The
// certificate trigger's lower(OLD.domain) took it, and ran the attacker's code as the
// owner. Definer bodies qualify pg_catalog.lower and cast the proxy's columns to text,
// so that pg_catalog's function and operators are the exact match.
func TestDefinerFunctions_IgnoreOverloadsPlantedForAVarcharColumn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	adminURL := pgtest.NewDB(t)
	admin := connect(t, adminURL)
	_, err := admin.Exec(ctx, `
GRANT CREATE ON SCHEMA public TO PUBLIC; -- PostgreSQL 13 and 14 as installed
-- A trigger that names the column keeps its type from being changed: off and on again.
DO $$
DECLARE
    r record;
    defs text[] := '{}';
    d text;
BEGIN
    FOR r IN SELECT tgname, pg_get_triggerdef(oid) AS def FROM pg_trigger
             WHERE tgrelid = 'proxy_certificates'::regclass AND NOT tgisinternal LOOP
        defs := defs || r.def;
        EXECUTE format('DROP TRIGGER %I ON proxy_certificates', r.tgname);
    END LOOP;
    ALTER TABLE proxy_certificates ALTER COLUMN domain TYPE varchar(253);
    FOREACH d IN ARRAY defs LOOP
        EXECUTE d;
    END LOOP;
END
$$;
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem) VALUES ('victim.example', 'pem', '`+sentinelKey+`')`)
	require.NoError(t, err)
	proxy := loginRole(t, admin, adminURL, proxyGrants)

	a := startAttack(t, roleURL(t, adminURL, proxy), nil, "")
	_, err = a.conn.Exec(ctx, `
CREATE FUNCTION public.lower(varchar) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM pg_temp.steal();
    RETURN pg_catalog.lower($1::text);
END
$f$;
CREATE FUNCTION public.planted_ne(varchar, varchar) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM pg_temp.steal();
    RETURN $1::text OPERATOR(pg_catalog.<>) $2::text;
END
$f$;
CREATE OPERATOR public.<> (LEFTARG = varchar, RIGHTARG = varchar, FUNCTION = public.planted_ne)`)
	require.NoError(t, err)
	_, err = a.conn.Exec(ctx, `INSERT INTO public.proxy_certificates (domain, certificate_pem, private_key_pem)
VALUES ('Planted.example', 'pem', 'key')`)
	require.NoError(t, err)
	_, err = a.conn.Exec(ctx, `UPDATE public.proxy_certificates SET domain = 'planted.example' WHERE domain = 'Planted.example'`)
	require.NoError(t, err)
	_, err = a.conn.Exec(ctx, `DELETE FROM public.proxy_certificates WHERE domain = 'planted.example'`)
	require.NoError(t, err)
	a.requireNoLeak(t, proxy)
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, n := range a.steals {
		require.Equal(t, proxy, n.Detail, "the planted overload ran as the owner")
	}
}

// The convention of migrations/embed.go, checked on every definer function in the
// catalogue: search_path pinned with pg_temp last, not executable by PUBLIC, every
// relation and function of schema public it names written public.x, nextval and its
// kin named in pg_catalog. And the tenant operations the proxy calls (functions
// returning proxy_domains rows) are SECURITY INVOKER.
func TestDefinerFunctions_FollowTheConvention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.NewDB(t)
	conn := connect(t, dbURL)
	rows, err := conn.Query(ctx, `
SELECT p.oid::regprocedure::text, p.prosrc, COALESCE(p.proconfig, '{}'),
       EXISTS (SELECT 1 FROM aclexplode(COALESCE(p.proacl, acldefault('f', p.proowner))) a
               WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE')
FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace AND p.prosecdef ORDER BY 1`)
	require.NoError(t, err)
	type definer struct {
		sig, src string
		config   []string
		public   bool
	}
	definers, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (definer, error) {
		var d definer
		return d, r.Scan(&d.sig, &d.src, &d.config, &d.public)
	})
	require.NoError(t, err)
	require.NotEmpty(t, definers)
	names := lines(t, dbURL, `
SELECT relname::text FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
UNION SELECT proname::text FROM pg_proc WHERE pronamespace = 'public'::regnamespace`)
	for _, d := range definers {
		assert.Equal(t, []string{"search_path=public, pg_temp"}, d.config, "%s: its SET clause", d.sig)
		assert.False(t, d.public, "%s: PUBLIC may execute it; REVOKE ALL ON FUNCTION ... FROM PUBLIC", d.sig)
		for _, n := range names {
			for _, m := range regexp.MustCompile(`(\w*\.)?\b`+regexp.QuoteMeta(n)+`\b`).FindAllStringSubmatch(d.src, -1) {
				assert.Equal(t, "public.", m[1], "%s names %s without its schema: write public.%s", d.sig, n, n)
			}
		}
		for _, m := range regexp.MustCompile(`(\w*\.)?\b(nextval|currval|setval)\s*\(`).FindAllStringSubmatch(d.src, -1) {
			assert.Equal(t, "pg_catalog.", m[1], "%s calls %s without its schema: write pg_catalog.%s", d.sig, m[2], m[2])
		}
	}
	invokers := lines(t, dbURL, `
SELECT oid::regprocedure::text || ' definer=' || prosecdef FROM pg_proc
WHERE pronamespace = 'public'::regnamespace AND prorettype = 'proxy_domains'::regtype ORDER BY 1`)
	require.Contains(t, invokers, "certworker_queue_for_issuance(uuid,uuid) definer=false")
	require.Contains(t, invokers, "certworker_update_domain(uuid,uuid,text,text) definer=false")
	for _, f := range invokers {
		require.True(t, strings.HasSuffix(f, " definer=false"), "a tenant operation runs with the proxy's rights: %s", f)
	}
}

// relation is a relation of schema public, as the attacker shadows it.
type relation struct {
	name    string
	kind    string // pg_class.relkind
	columns []column
	// uniques are the column lists of its unique indexes, so that an INSERT ... ON
	// CONFLICT meant for it also works on the shadow (and reaches its trigger).
	uniques [][]string
}

type column struct{ name, typ string }

// definerFunc is a SECURITY DEFINER function of schema public.
type definerFunc struct {
	sig, name string
	trigger   bool
	// args are the argument types, for a direct call.
	args []string
	// triggerTables are the tables whose triggers call it.
	triggerTables []string
	// host are the columns a table of the attacker's needs to host it as a trigger:
	// those of the table one of its triggers is on.
	host []column
}

// catalogue reads the relations of schema public and its SECURITY DEFINER functions.
func catalogue(t *testing.T, conn *pgx.Conn) ([]relation, []definerFunc) {
	t.Helper()
	ctx := context.Background()
	rows, err := conn.Query(ctx, `
SELECT c.relname::text, c.relkind::text,
       COALESCE((SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute a
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '{}'),
       COALESCE((SELECT array_agg(format_type(a.atttypid, a.atttypmod) ORDER BY a.attnum) FROM pg_attribute a
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '{}'),
       COALESCE((SELECT array_agg((SELECT string_agg(a.attname::text, ',' ORDER BY k.ord)
                                   FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k (attnum, ord)
                                   JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum))
                 FROM pg_index i
                 WHERE i.indrelid = c.oid AND i.indisunique AND i.indpred IS NULL
                   AND i.indexprs IS NULL), '{}')
FROM pg_class c
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
ORDER BY 1`)
	require.NoError(t, err)
	rels, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (relation, error) {
		var rel relation
		var names, types, uniques []string
		if err := r.Scan(&rel.name, &rel.kind, &names, &types, &uniques); err != nil {
			return rel, err
		}
		for i := range names {
			rel.columns = append(rel.columns, column{names[i], types[i]})
		}
		for _, u := range uniques {
			rel.uniques = append(rel.uniques, strings.Split(u, ","))
		}
		return rel, nil
	})
	require.NoError(t, err)
	byName := map[string]relation{}
	for _, r := range rels {
		byName[r.name] = r
	}

	rows, err = conn.Query(ctx, `
SELECT p.oid::regprocedure::text, p.proname::text, p.prorettype = 'trigger'::regtype,
       COALESCE((SELECT array_agg(format_type(a.t, NULL) ORDER BY a.o)
                 FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a (t, o)), '{}'),
       COALESCE((SELECT array_agg(DISTINCT c.relname::text ORDER BY c.relname::text)
                 FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid
                 WHERE tg.tgfoid = p.oid AND c.relnamespace = 'public'::regnamespace), '{}')
FROM pg_proc p
WHERE p.pronamespace = 'public'::regnamespace AND p.prosecdef
ORDER BY 1`)
	require.NoError(t, err)
	definers, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (definerFunc, error) {
		var f definerFunc
		err := r.Scan(&f.sig, &f.name, &f.trigger, &f.args, &f.triggerTables)
		return f, err
	})
	require.NoError(t, err)
	for i, f := range definers {
		host := "proxy_domains" // a trigger function attached nowhere yet
		if len(f.triggerTables) > 0 {
			host = f.triggerTables[0]
		}
		definers[i].host = byName[host].columns
	}
	return rels, definers
}

// loginRole creates a login role (password "attack"), runs grants (a format string
// whose %[1]s is the role's name) for it, and drops it when the test ends.
func loginRole(t *testing.T, admin *pgx.Conn, adminURL, grants string) string {
	t.Helper()
	ctx := context.Background()
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "attacker_" + hex.EncodeToString(b[:])
	_, err := admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN PASSWORD 'attack'")
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), adminURL)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = c.Exec(context.Background(), "DROP ROLE "+role)
	})
	if grants != "" {
		_, err = admin.Exec(ctx, fmt.Sprintf(grants, role))
		require.NoError(t, err)
	}
	return role
}

func roleURL(t *testing.T, adminURL, role string) string {
	t.Helper()
	u, err := url.Parse(adminURL)
	require.NoError(t, err)
	u.User = url.UserPassword(role, "attack")
	return u.String()
}

func roleKind(a attacker) string {
	if a.proxy {
		return "proxy role"
	}
	return "no grants"
}

// attack is an attacker's session, its shadows in place.
type attack struct {
	conn *pgx.Conn
	seqs []string
	mu   sync.Mutex
	// steals are the notices of the attacker's code: who ran it, what it read.
	steals []*pgconn.Notice
}

// stealSQL is the attacker's code: steal() tells, by a notice, which role runs it and
// the private keys that role could read; steal_trigger() runs it as a trigger.
const stealSQL = `
CREATE FUNCTION pg_temp.steal() RETURNS boolean LANGUAGE plpgsql AS $f$
DECLARE
    v_keys text;
BEGIN
    BEGIN
        SELECT string_agg(private_key_pem, ',') INTO v_keys FROM public.proxy_certificates;
    EXCEPTION WHEN insufficient_privilege THEN
        v_keys := NULL;
    END;
    RAISE NOTICE USING MESSAGE = 'steal', DETAIL = current_user, HINT = COALESCE(v_keys, '(none readable)');
    RETURN false;
END
$f$;
CREATE FUNCTION pg_temp.steal_trigger() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM pg_temp.steal();
    IF TG_LEVEL = 'ROW' AND TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END
$f$;`

// startAttack connects as the attacker and shadows relations of rels: in round
// "tables" every one, with a temporary table whose triggers steal on every write; in
// round "view NAME" that one alone, with a temporary view that steals on every read
// and every insert (an INSTEAD OF trigger). Sequences are shadowed
// with temporary sequences in every round.
func startAttack(t *testing.T, attackerURL string, rels []relation, round string) *attack {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(attackerURL)
	require.NoError(t, err)
	a := &attack{}
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if n.Message == "steal" {
			a.mu.Lock()
			a.steals = append(a.steals, n)
			a.mu.Unlock()
		}
	}
	a.conn, err = pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { a.conn.Close(context.Background()) })

	ddl := []string{stealSQL}
	for _, r := range rels {
		name, q := pgx.Identifier{r.name}.Sanitize(), pgx.Identifier{"pg_temp", r.name}.Sanitize()
		switch {
		case r.kind == "S":
			ddl = append(ddl, "CREATE TEMP SEQUENCE "+name)
			a.seqs = append(a.seqs, q)
		case round == "view "+r.name:
			// One row of NULLs, from a subquery that OFFSET 0 keeps the planner from
			// flattening: a view of constants would let it fold a condition on them
			// (WHERE id) to false, and never scan the view.
			var outer, inner []string
			for _, c := range r.columns {
				col := pgx.Identifier{c.name}.Sanitize()
				outer = append(outer, "s."+col)
				inner = append(inner, fmt.Sprintf("NULL::%s AS %s", c.typ, col))
			}
			ddl = append(ddl,
				fmt.Sprintf("CREATE TEMP VIEW %s AS SELECT %s FROM (SELECT %s, pg_temp.steal() AS stolen OFFSET 0) s",
					name, strings.Join(outer, ", "), strings.Join(inner, ", ")),
				"CREATE TRIGGER steal_instead INSTEAD OF INSERT OR UPDATE OR DELETE ON "+q+
					" FOR EACH ROW EXECUTE FUNCTION pg_temp.steal_trigger()")
		case round == "tables":
			var cols []string
			for _, c := range r.columns {
				cols = append(cols, pgx.Identifier{c.name}.Sanitize()+" "+c.typ)
			}
			ddl = append(ddl, fmt.Sprintf("CREATE TEMP TABLE %s (%s)", name, strings.Join(cols, ", ")))
			for _, u := range r.uniques {
				ddl = append(ddl, fmt.Sprintf("CREATE UNIQUE INDEX ON %s (%s)", q, quoteAll(u)))
			}
			ddl = append(ddl,
				"CREATE TRIGGER steal_row BEFORE INSERT OR UPDATE OR DELETE ON "+q+
					" FOR EACH ROW EXECUTE FUNCTION pg_temp.steal_trigger()",
				"CREATE TRIGGER steal_statement BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON "+q+
					" FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.steal_trigger()")
		}
	}
	_, err = a.conn.PgConn().Exec(ctx, strings.Join(ddl, ";\n")).ReadAll()
	require.NoError(t, err, "set up the attacker's shadows")
	return a
}

func quoteAll(names []string) string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = pgx.Identifier{n}.Sanitize()
	}
	return strings.Join(out, ", ")
}

// reach runs f as the attacker can without writing the proxy's tables: a direct call,
// or, for a trigger function, as the trigger of a temporary table of its own, written
// every way the trigger fires. It returns the first error.
func (a *attack) reach(t *testing.T, f definerFunc) error {
	t.Helper()
	ctx := context.Background()
	if !f.trigger {
		args := make([]string, len(f.args))
		for i, typ := range f.args {
			args[i] = valueOf(typ)
		}
		_, err := a.conn.Exec(ctx, fmt.Sprintf("SELECT public.%s(%s)", pgx.Identifier{f.name}.Sanitize(), strings.Join(args, ", ")))
		return err
	}
	var cols, vals []string
	for _, c := range f.host {
		cols = append(cols, pgx.Identifier{c.name}.Sanitize()+" "+c.typ)
		vals = append(vals, valueOf(c.typ))
	}
	for _, stmt := range []string{
		fmt.Sprintf("CREATE TEMP TABLE attacker_host (%s)", strings.Join(cols, ", ")),
		fmt.Sprintf("CREATE TRIGGER attacker_host BEFORE INSERT OR UPDATE OR DELETE ON pg_temp.attacker_host FOR EACH ROW EXECUTE FUNCTION public.%s()",
			pgx.Identifier{f.name}.Sanitize()),
		fmt.Sprintf("INSERT INTO pg_temp.attacker_host VALUES (%s)", strings.Join(vals, ", ")),
		fmt.Sprintf("UPDATE pg_temp.attacker_host SET %[1]s = %[1]s", pgx.Identifier{f.host[0].name}.Sanitize()),
		"DELETE FROM pg_temp.attacker_host",
	} {
		if _, err := a.conn.Exec(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

// valueOf is an SQL value of type typ for the attacker's rows and calls.
func valueOf(typ string) string {
	switch typ {
	case "uuid":
		return "gen_random_uuid()"
	case "text", "character varying":
		return "'shadow.example'"
	case "smallint", "integer", "bigint":
		return "0"
	case "boolean":
		return "true"
	case "timestamp with time zone":
		return "now()"
	}
	return "NULL::" + typ
}

// proxyWrites makes, in one transaction, the writes of the proxy that fire
// certworker's triggers: a tenant and a pending domain added, the domain verified
// (it enters the claimable set), a certificate stored, the domain's profile changed
// while active, the certificate replaced and deleted, the domain deleted. Each runs in a savepoint, so that one that fails leaves the rest
// to run. It returns the ones that failed, and how often each function of schema
// public ran (track_functions, set for the role).
func (a *attack) proxyWrites(t *testing.T) (failed []string, fired map[string]int64) {
	t.Helper()
	ctx := context.Background()
	tx, err := a.conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var tenant, domain string
	require.NoError(t, tx.QueryRow(ctx, `SELECT gen_random_uuid()::text, gen_random_uuid()::text`).Scan(&tenant, &domain))
	name := "proxy-" + domain[:8] + ".example"
	for _, w := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO public.proxy_tenants (id, name, slug, email) VALUES ($1, 'shop', $2, 'shop@example.com')`, []any{tenant, "shop-" + tenant}},
		{`INSERT INTO public.proxy_domains (id, tenant_id, domain, verification_token) VALUES ($1, $2, $3, 'tok')`, []any{domain, tenant, name}},
		{`UPDATE public.proxy_domains SET verification_status = 'verified' WHERE id = $1`, []any{domain}},
		{`INSERT INTO public.proxy_certificates (domain, certificate_pem, private_key_pem) VALUES ($1, 'pem', 'key')`, []any{name}},
		// The tenant's profile set by a plain UPDATE on an active domain
		// (certworker_profile_changed).
		{`UPDATE public.proxy_domains SET ssl_status = 'active' WHERE id = $1`, []any{domain}},
		{`UPDATE public.proxy_domains SET ssl_profile = 'shortlived' WHERE id = $1`, []any{domain}},
		{`UPDATE public.proxy_certificates SET certificate_pem = 'pem2' WHERE domain = $1`, []any{name}},
		{`DELETE FROM public.proxy_certificates WHERE domain = $1`, []any{name}},
		{`DELETE FROM public.proxy_domains WHERE id = $1`, []any{domain}},
	} {
		_, err := tx.Exec(ctx, "SAVEPOINT proxy_write")
		require.NoError(t, err)
		if _, err := tx.Exec(ctx, w.sql, w.args...); err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", w.sql, err))
			_, err = tx.Exec(ctx, "ROLLBACK TO SAVEPOINT proxy_write")
			require.NoError(t, err)
			continue
		}
		_, err = tx.Exec(ctx, "RELEASE SAVEPOINT proxy_write")
		require.NoError(t, err)
	}
	rows, err := tx.Query(ctx, `SELECT funcname::text, calls FROM pg_stat_xact_user_functions WHERE schemaname = 'public'`)
	require.NoError(t, err)
	fired = map[string]int64{}
	var fn string
	var calls int64
	_, err = pgx.ForEachRow(rows, []any{&fn, &calls}, func() error {
		fired[fn] = calls
		return nil
	})
	require.NoError(t, err)
	return failed, fired
}

// requireNoLeak fails when the attacker's code ran as any role but role (so with
// rights it does not hold), or when a sequence of the attacker's was drawn from.
func (a *attack) requireNoLeak(t *testing.T, role string) {
	t.Helper()
	ctx := context.Background()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, n := range a.steals {
		assert.Equal(t, role, n.Detail, "the attacker's code ran as %s; it read these keys: %s", n.Detail, n.Hint)
		assert.NotContains(t, n.Hint, sentinelKey, "the attacker's code read a private key its role may not read")
	}
	for _, s := range a.seqs {
		var drawn bool
		require.NoError(t, a.conn.QueryRow(ctx, "SELECT is_called FROM "+s).Scan(&drawn))
		assert.False(t, drawn, "certworker drew from the attacker's sequence %s", s)
	}
	if t.Failed() {
		t.FailNow()
	}
}
