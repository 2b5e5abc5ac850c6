package queue

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ConfigurePool sets up the sessions of a pool that the queue's statements run in,
// keeping the pool's own AfterConnect hook: JIT compilation off. The queue's
// statements are short and run often, but their estimated cost at a million rows
// (the claim's correlated look-ups, counted once for every row the planner thinks
// it may read) crosses jit_above_cost, and compiling the claim took 36 ms of its 38
// (bench/plans.txt). A SET after connecting rather than a startup parameter, which a
// pooler such as PgBouncer refuses ("unsupported startup parameter"); the proxy's
// sessions keep their own setting.
func ConfigurePool(cfg *pgxpool.Config) {
	prev := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if prev != nil {
			if err := prev(ctx, conn); err != nil {
				return err
			}
		}
		if _, err := conn.Exec(ctx, "SET jit = off"); err != nil {
			return fmt.Errorf("set up the session: %w", err)
		}
		return nil
	}
}

// NewPool is pgxpool.New with ConfigurePool's sessions.
func NewPool(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	ConfigurePool(cfg)
	return pgxpool.NewWithConfig(ctx, cfg)
}
