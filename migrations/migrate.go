package migrations

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// Result is one migration that Apply ran.
type Result struct {
	Version  int64
	Source   string
	Duration string
}

// Apply brings the database at databaseURL up to the newest embedded migration.
//
// It is idempotent, and safe when several instances run it at once: goose holds a
// PostgreSQL session advisory lock for the whole run, so the second instance waits and
// then finds nothing left to do, instead of both applying the same migration.
func Apply(ctx context.Context, databaseURL string) ([]Result, error) {
	cfg, err := stdlibConfig(databaseURL)
	if err != nil {
		return nil, err
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	return ApplyDB(ctx, db)
}

// ApplyDB is Apply on an open database handle.
func ApplyDB(ctx context.Context, db *sql.DB) ([]Result, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("migration lock: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, FS,
		goose.WithSessionLocker(locker))
	if err != nil {
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	results, err := provider.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("apply migrations: %w", err)
	}
	out := make([]Result, 0, len(results))
	for _, r := range results {
		out = append(out, Result{Version: r.Source.Version, Source: r.Source.Path, Duration: r.Duration.String()})
	}
	return out, nil
}

// HasPending reports whether the database lacks any embedded migration.
func HasPending(ctx context.Context, db *sql.DB) (bool, error) {
	provider, err := goose.NewProvider(goose.DialectPostgres, db, FS)
	if err != nil {
		return false, fmt.Errorf("load migrations: %w", err)
	}
	pending, err := provider.HasPending(ctx)
	if err != nil {
		return false, fmt.Errorf("read schema version: %w", err)
	}
	return pending, nil
}
