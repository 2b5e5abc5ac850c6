package migrations_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/releasetest"
	"github.com/certworker/certworker/migrations"
)

// migrateTo runs Up of rel on url.
func migrateTo(t *testing.T, url string, rel migrations.Release) ([]migrations.Result, error) {
	t.Helper()
	return migrations.Up(context.Background(), openDB(t, url), migrations.Options{Release: &rel})
}

// migrate records the release it migrated to, and the oldest it serves: this release
// alone, since the binaries before it refuse any newer schema.
func TestRelease_MigrateRecordsTheRelease(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t)
	rec, err := migrations.ReadRelease(context.Background(), openDB(t, url))
	require.NoError(t, err)
	require.Equal(t, &migrations.ReleaseRecord{Release: certworker.Version(), ServesFrom: certworker.Version()}, rec)
	require.Equal(t, certworker.Version(), migrations.Current().Version)
}

// The next release's migrate (a column, a trigger, a function body) leaves a schema
// this binary's run accepts, and the next binary's too; the record says which release
// it is and that it serves this one.
func TestRelease_CheckAcceptsTheNextReleasesSchema(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t)
	next := releasetest.Next(t)
	results, err := migrateTo(t, url, next)
	require.NoError(t, err)
	var sources []string
	for _, r := range results {
		sources = append(sources, r.Source)
	}
	require.ElementsMatch(t, []string{releasetest.Migration, "functions/certworker_queue_place.sql", "functions/" + releasetest.Trigger + ".sql"}, sources)

	db := openDB(t, url)
	rec, err := migrations.ReadRelease(context.Background(), db)
	require.NoError(t, err)
	require.Equal(t, &migrations.ReleaseRecord{Release: next.Version, ServesFrom: certworker.Version()}, rec)
	require.NoError(t, migrations.Check(context.Background(), db), "this release on the next one's schema")
	require.NoError(t, migrations.CheckRelease(context.Background(), db, next))
}

// The next release's binary on this release's schema: behind, naming the release whose
// migrate to run.
func TestRelease_CheckRefusesASchemaOlderThanTheBinary(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t)
	next := releasetest.Next(t)
	err := migrations.CheckRelease(context.Background(), openDB(t, url), next)
	var behind *migrations.BehindError
	require.ErrorAs(t, err, &behind)
	require.Equal(t, []int64{99001}, behind.Missing)
	require.Contains(t, err.Error(), "run `certworker migrate` of release "+next.Version+" first")
}

// A release two ahead of this one (its record serves the next release and later, not
// this one) is past this binary's window: refused, naming the releases to run. Its
// migrations need not be unknown to this binary for that (a release that changed only
// what it serves).
func TestRelease_CheckRefusesASchemaPastTheWindow(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t)
	next := releasetest.Next(t)
	_, err := migrateTo(t, url, next)
	require.NoError(t, err)
	later := releasetest.NextVersion(next.Version)
	_, err = connect(t, url).Exec(context.Background(), `UPDATE certworker_release SET release = $1, serves_from = $2`, later, next.Version)
	require.NoError(t, err)

	err = migrations.Check(context.Background(), openDB(t, url))
	var window *migrations.WindowError
	require.ErrorAs(t, err, &window)
	require.Equal(t, migrations.WindowError{Database: later, ServesFrom: next.Version, Binary: certworker.Version()}, *window)
	require.Contains(t, err.Error(), "run certworker "+later+", or "+next.Version)
	require.NoError(t, migrations.CheckRelease(context.Background(), openDB(t, url), next), "the next release is still served")

	_, err = connect(t, url).Exec(context.Background(), `UPDATE certworker_release SET serves_from = release`)
	require.NoError(t, err)
	err = migrations.CheckRelease(context.Background(), openDB(t, url), next)
	require.ErrorAs(t, err, &window)
	require.Contains(t, err.Error(), "which serves no older release")
	require.Contains(t, err.Error(), "run certworker "+later)
}

// Migrations this binary does not know, with no record of a release that serves it
// (the record removed by hand): refused as ahead, as before the window.
func TestRelease_UnknownMigrationsWithoutARecordAreAhead(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t)
	_, err := migrateTo(t, url, releasetest.Next(t))
	require.NoError(t, err)
	_, err = connect(t, url).Exec(context.Background(), `DELETE FROM certworker_release`)
	require.NoError(t, err)
	err = migrations.Check(context.Background(), openDB(t, url))
	var ahead *migrations.AheadError
	require.ErrorAs(t, err, &ahead)
	require.Equal(t, []int64{99001}, ahead.Unknown)
}

// migrate of this release on a database the next release migrated (a rollback, or an
// old pod's Job run again) changes nothing, not a function body nor the record, and
// says so with a *NewerError; past the window it says which release to migrate with.
func TestRelease_MigrateOfAnOlderReleaseChangesNothing(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t)
	next := releasetest.Next(t)
	_, err := migrateTo(t, url, next)
	require.NoError(t, err)
	before := lines(t, url, catalogueSQL)
	beforeRows := lines(t, url, `SELECT name || ' ' || sha256 || ' ' || generation FROM certworker_functions
UNION ALL SELECT release || ' ' || serves_from || ' ' || migrated_at FROM certworker_release ORDER BY 1`)

	results, err := migrations.Up(context.Background(), openDB(t, url), migrations.Options{})
	require.Empty(t, results)
	var newer *migrations.NewerError
	require.ErrorAs(t, err, &newer)
	require.Equal(t, migrations.NewerError{Database: next.Version, ServesFrom: certworker.Version(), Binary: certworker.Version()}, *newer)
	require.True(t, newer.Served())
	require.Contains(t, err.Error(), "nothing changed")
	require.Equal(t, before, lines(t, url, catalogueSQL))
	require.Equal(t, beforeRows, lines(t, url, `SELECT name || ' ' || sha256 || ' ' || generation FROM certworker_functions
UNION ALL SELECT release || ' ' || serves_from || ' ' || migrated_at FROM certworker_release ORDER BY 1`))

	_, err = connect(t, url).Exec(context.Background(), `UPDATE certworker_release SET serves_from = release`)
	require.NoError(t, err)
	_, err = migrations.Up(context.Background(), openDB(t, url), migrations.Options{})
	require.ErrorAs(t, err, &newer)
	require.False(t, newer.Served())
	require.Contains(t, err.Error(), "run `certworker migrate` of release "+next.Version+" or newer")
}

// The next release's migrate twice: the second changes nothing, and the record keeps
// the time of the first.
func TestRelease_MigrateOfTheSameReleaseAgainChangesNothing(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t)
	next := releasetest.Next(t)
	_, err := migrateTo(t, url, next)
	require.NoError(t, err)
	before := lines(t, url, `SELECT release || ' ' || migrated_at || ' ' || xmin FROM certworker_release`)
	results, err := migrateTo(t, url, next)
	require.NoError(t, err)
	require.Empty(t, results)
	require.Equal(t, before, lines(t, url, `SELECT release || ' ' || migrated_at || ' ' || xmin FROM certworker_release`))
}
