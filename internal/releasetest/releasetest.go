// Package releasetest builds a synthetic next release of this binary's, for the tests
// of the compatibility window (docs/upgrading.md): this binary's migrations and
// functions, plus what a next release that keeps to the window may do.
//
//   - A numbered migration adds a column to proxy_domains (ssl_next_seen) and
//     attaches a new trigger to it (certworker_next_seen, BEFORE UPDATE OF
//     ssl_status), which records in it every status the row takes, whoever writes it.
//   - certworker_queue_place, which this release's claim and wake trigger call, gets
//     a new body that reads the new column and keeps this release's result.
//   - functions.sum gets the next generation.
package releasetest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"golang.org/x/mod/semver"

	"github.com/certworker/certworker/migrations"
)

// Migration is the file name of the next release's numbered migration: past any
// version this repository will reach.
const Migration = "99001_next_release.sql"

// Column is the column the next release adds to proxy_domains, and Trigger the
// trigger (and its function) that fills it.
const (
	Column  = "ssl_next_seen"
	Trigger = "certworker_next_seen"
)

const migrationSQL = `-- The next release's additions (internal/releasetest).
-- +goose Up
ALTER TABLE proxy_domains ADD COLUMN IF NOT EXISTS ssl_next_seen text;

-- +goose StatementBegin
DO $$
BEGIN
    IF to_regprocedure('public.certworker_next_seen()') IS NULL THEN
        CREATE FUNCTION public.certworker_next_seen() RETURNS trigger
        LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END';
        REVOKE ALL ON FUNCTION public.certworker_next_seen() FROM PUBLIC;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'certworker_next_seen'
                   AND tgrelid = 'proxy_domains'::regclass) THEN
        CREATE TRIGGER certworker_next_seen BEFORE UPDATE OF ssl_status ON proxy_domains
            FOR EACH ROW EXECUTE FUNCTION public.certworker_next_seen();
    END IF;
END
$$;
-- +goose StatementEnd
`

const triggerSQL = `CREATE OR REPLACE FUNCTION public.certworker_next_seen() RETURNS trigger
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    NEW.ssl_next_seen := COALESCE(OLD.ssl_next_seen || ',', '') || NEW.ssl_status::text;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION public.certworker_next_seen() FROM PUBLIC;
`

// placeHeld is what the next release's certworker_queue_place adds to each of its
// "in line" conditions: it reads the new column, and holds for every row.
const placeHeld = `d.ssl_held IS NULL`

var generationLine = regexp.MustCompile(`(?m)^generation (\d+)$`)

// Next is the synthetic release after this binary's: the next minor version, which
// serves this binary's release (ServesFrom).
func Next(t testing.TB) migrations.Release {
	t.Helper()
	cur := migrations.Current()
	files := fstest.MapFS{}
	err := fs.WalkDir(cur.FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(cur.FS, p)
		files[p] = &fstest.MapFile{Data: b}
		return err
	})
	if err != nil {
		t.Fatalf("next release: %v", err)
	}
	files[Migration] = &fstest.MapFile{Data: []byte(migrationSQL)}
	files["functions/"+Trigger+".sql"] = &fstest.MapFile{Data: []byte(triggerSQL)}
	place := string(files["functions/certworker_queue_place.sql"].Data)
	if strings.Count(place, placeHeld) != 2 {
		t.Fatalf("next release: certworker_queue_place.sql no longer reads %q twice: change releasetest with it", placeHeld)
	}
	place = strings.ReplaceAll(place, placeHeld, placeHeld+` AND (d.ssl_next_seen IS NULL OR d.ssl_next_seen IS NOT NULL)`)
	files["functions/certworker_queue_place.sql"] = &fstest.MapFile{Data: []byte(place)}

	sum := string(files["functions/functions.sum"].Data)
	m := generationLine.FindStringSubmatch(sum)
	if m == nil {
		t.Fatalf("next release: functions.sum has no generation line")
	}
	gen, _ := strconv.Atoi(m[1])
	sum = generationLine.ReplaceAllString(sum, fmt.Sprintf("generation %d", gen+1))
	var out []string
	for _, line := range strings.Split(sum, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "certworker_queue_place" {
			line = "certworker_queue_place " + hash(place)
		}
		out = append(out, line)
	}
	sum = strings.Join(out, "\n") + "\n" + Trigger + " " + hash(triggerSQL) + "\n"
	files["functions/functions.sum"] = &fstest.MapFile{Data: []byte(sum)}
	return migrations.Release{Version: NextVersion(cur.Version), ServesFrom: cur.Version, FS: files}
}

// NextVersion is the next minor version after v (1.2.3 and 1.2.3-rc.1: 1.3.0).
func NextVersion(v string) string {
	mm := strings.TrimPrefix(semver.MajorMinor("v"+v), "v")
	major, minor, _ := strings.Cut(mm, ".")
	n, _ := strconv.Atoi(minor)
	return fmt.Sprintf("%s.%d.0", major, n+1)
}

func hash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}
