package pgtest_test

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The test bed itself: a fresh database has the schema, and two tests' databases do
// not see each other's rows (the isolation every parallel queue test relies on).
func TestNewDB_IsMigratedAndIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := pgtest.NewDB(t), pgtest.NewDB(t)
	ca, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close(ctx)
	cb, err := pgx.Connect(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close(ctx)
	if _, err := ca.Exec(ctx, "INSERT INTO proxy_tenants (name, slug, email) VALUES ('a', 'a', 'a@example.com')"); err != nil {
		t.Fatalf("schema missing in a fresh database: %v", err)
	}
	var n int
	if err := cb.QueryRow(ctx, "SELECT count(*) FROM proxy_tenants").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("a row written in one test's database is visible in another's: %d rows", n)
	}
}

// tbRecorder is a testing.TB that records Fatalf and Skipf instead of ending a test,
// to test what pgtest does to the test that calls it.
type tbRecorder struct {
	testing.TB
	fatal, skip string
}

type stopped struct{}

func (r *tbRecorder) Helper() {}
func (r *tbRecorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	panic(stopped{})
}
func (r *tbRecorder) Skipf(format string, args ...any) {
	r.skip = fmt.Sprintf(format, args...)
	panic(stopped{})
}

func (r *tbRecorder) run(f func(testing.TB)) {
	defer func() {
		if p := recover(); p != nil {
			if _, ok := p.(stopped); !ok {
				panic(p)
			}
		}
	}()
	f(r)
}

// A test that needs a server of its own must not pass silently when TEST_DATABASE_URL
// makes every test share one: it fails, unless the opt-out says to skip it knowingly.
// (Not parallel: it sets the environment.)
func TestStartServer_FailsUnderTestDatabaseURLUnlessOptedOut(t *testing.T) {
	t.Setenv("TEST_DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
	t.Setenv(pgtest.SkipOwnServer, "")
	r := &tbRecorder{TB: t}
	r.run(func(tb testing.TB) { pgtest.StartServer(tb) })
	require.Contains(t, r.fatal, "needs a PostgreSQL container of its own")
	require.Contains(t, r.fatal, pgtest.SkipOwnServer)
	require.Empty(t, r.skip)

	t.Setenv(pgtest.SkipOwnServer, "1")
	r = &tbRecorder{TB: t}
	r.run(func(tb testing.TB) { pgtest.StartServer(tb) })
	require.Empty(t, r.fatal)
	require.Contains(t, r.skip, "skipped")
}

// The shared server checks passwords with md5 (cheapPasswords): the superuser's and a
// new role's passwords are stored as md5, and a wrong password is still refused with
// SQLSTATE 28P01. Guards against the switch silently leaving SCRAM (each connect then
// costs the race-built client 10 ms of CPU) and against it letting any password in.
func TestShared_ChecksPasswordsWithMD5(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDB(t)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	role := "md5check_" + fmt.Sprint(time.Now().UnixNano())
	_, err = conn.Exec(ctx, "CREATE ROLE "+role+" LOGIN PASSWORD 'right'")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
	rows, err := conn.Query(ctx, `SELECT rolname, left(rolpassword, 3) FROM pg_authid WHERE rolname IN (current_user, $1)`, role)
	require.NoError(t, err)
	kinds, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Role, Kind string }])
	require.NoError(t, err)
	require.Len(t, kinds, 2)
	for _, k := range kinds {
		require.Equal(t, "md5", k.Kind, "%s's password", k.Role)
	}

	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.User = url.UserPassword(role, "wrong")
	_, err = pgx.Connect(ctx, u.String())
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "28P01", pgErr.Code)
	u.User = url.UserPassword(role, "right")
	ok, err := pgx.Connect(ctx, u.String())
	require.NoError(t, err)
	require.NoError(t, ok.Close(ctx))
}
