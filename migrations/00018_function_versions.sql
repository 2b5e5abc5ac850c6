-- What the functions step of `migrate` applied (migrations/functions/): one row per
-- certworker function, the SHA-256 of the file it was applied from and the
-- generation of the binary that applied it. An older binary's migrate sees a newer
-- generation here and leaves the functions alone; `run` refuses to start when the
-- hashes here are not those it was built with. Catalogue only: no lock on any table of
-- the proxy's.
-- +goose Up
CREATE TABLE IF NOT EXISTS certworker_functions (
    name        text PRIMARY KEY,
    sha256      text NOT NULL,
    generation  integer NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE IF EXISTS certworker_functions;
