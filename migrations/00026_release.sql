-- The release the schema was last migrated to, and the oldest release whose binaries
-- still run on it (the compatibility window: docs/upgrading.md). One row, written by
-- `migrate` once every migration and function is applied; `run` reads it at start to
-- accept the schema of the next release, and `migrate` of an older release reads it
-- to change nothing. A table of certworker's own: no lock on any of the proxy's.
-- +goose Up
CREATE TABLE IF NOT EXISTS certworker_release (
    id           boolean PRIMARY KEY DEFAULT true CHECK (id),
    release      text NOT NULL,
    serves_from  text NOT NULL,
    migrated_at  timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE IF EXISTS certworker_release;
