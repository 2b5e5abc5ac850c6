package migrations

import (
	"fmt"

	"github.com/jackc/pgx/v5"
)

func stdlibConfig(databaseURL string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	return cfg, nil
}
