package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/singleflight"

	"github.com/certworker/certworker/acme"
)

// readyTimeout bounds /readyz's checks: long enough for a connection that tries a
// dead first host of a multi-host URL (the per-host connect timeout, 2 s) before the
// live one.
const readyTimeout = 5 * time.Second

// readiness answers /readyz with one check at a time: the probes that come while a
// check runs wait for its answer instead of starting checks of their own. A prober
// that asks often, or many probers at once, thus costs the pool one connection at
// most, and one check at most waits among the worker's statements for the pool's
// connections. Without it, after a failover, when each new connection first waits
// out the dead host, probes every 100 ms queued some fifty checks, each wanting two
// or three connections, on a pool of four.
type readiness struct {
	run   func(ctx context.Context) string
	calls singleflight.Group
}

func newReadiness(run func(ctx context.Context) string) *readiness {
	return &readiness{run: run}
}

// check returns why the instance is not ready, or "" when it is: the answer of the
// check under way when ctx's probe came, or of one it starts. The check runs under
// readyTimeout whatever becomes of the probe that started it, whose answer the
// others share.
func (r *readiness) check(ctx context.Context) string {
	answer := r.calls.DoChan("", func() (any, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readyTimeout)
		defer cancel()
		return r.run(cctx), nil
	})
	select {
	case res := <-answer:
		return res.Val.(string)
	case <-ctx.Done():
		return "readiness check abandoned: " + ctx.Err().Error()
	}
}

// workerState is what /readyz asks of the worker (*worker.Worker).
type workerState interface {
	// Ready reports whether the wake source is connected.
	Ready() bool
	// Halted is the error that stopped the worker claiming, or nil.
	Halted() error
}

// notReady is why /readyz answers 503, or "" when it answers 200. second is the
// second CA's issuer, nil for none. Its checks share one connection of the pool: it
// answers a ping (the database answers), and the stored accounts are read on it.
func notReady(ctx context.Context, pool *pgxpool.Pool, wk workerState, issuer, second *acme.Issuer) string {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		st := pool.Stat()
		return fmt.Sprintf("database unreachable (no connection of the pool: %d of %d in use, %d being made)",
			st.AcquiredConns(), st.MaxConns(), st.ConstructingConns())
	}
	defer conn.Release()
	switch {
	case conn.Ping(ctx) != nil:
		return "database unreachable"
	case !wk.Ready():
		return "listener not connected"
	}
	if err := keysReady(ctx, wk, issuer, conn); err != nil {
		return err.Error()
	}
	if err := secondKeyReady(ctx, second, conn); err != nil {
		return err.Error()
	}
	return ""
}
