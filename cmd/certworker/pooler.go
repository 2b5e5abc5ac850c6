package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// What sits between certworker and PostgreSQL, as far as a client can tell.
const (
	// connSession: every statement of a client connection runs in one server
	// session, as on a direct connection or through a pooler in session mode.
	connSession = "direct or session-pooled"
	// connTransaction: a pooler hands the client's connection a server session per
	// transaction (PgBouncer's pool_mode = transaction, and the like).
	connTransaction = "transaction pooler"
	// connStatement: a pooler that refuses transactions (pool_mode = statement).
	connStatement = "statement pooler"
	// connUnknown: the probe could not finish.
	connUnknown = "unknown"
)

// poolerProbeRounds: PgBouncer hands the server connection released last to the next
// transaction (LIFO), which makes one round conclusive there; a pooler that rotates
// its connections gets a few more chances to show itself.
const poolerProbeRounds = 3

// poolerProbeTimeout bounds each statement of the probe. Behind a transaction pooler
// with a single server connection, the probe's second statement waits for the
// transaction it holds open; that wait is how such a pooler shows itself.
const poolerProbeTimeout = 2 * time.Second

// errPooler is a connection certworker cannot work through.
var errPooler = errors.New("certworker needs a direct or session-pooled connection: LISTEN, the migration lock and the replication slot of --wake logical live in one server session, which a transaction pooler does not keep")

// detectPooler tells whether two statements on one client connection run in the same
// server session, the thing a transaction pooler breaks. Connection A runs a
// statement, connection B opens a transaction (which takes the server session A just
// released, when a transaction pooler is in between) and holds it, and A runs a
// second statement: on a direct or session-pooled connection A's server process is
// the same both times and B's is another; behind a transaction pooler A changes
// process, or B got A's, or A waits for B. It returns one of the conn* verdicts and
// what showed it. The probe uses the simple protocol, which a pooler in any mode
// passes through, and changes nothing on the server.
func detectPooler(ctx context.Context, pool *pgxpool.Pool) (verdict, evidence string) {
	// A pool limited to one connection would wait for ever for the second.
	ctx, cancel := context.WithTimeout(ctx, 5*poolerProbeTimeout)
	defer cancel()
	a, err := pool.Acquire(ctx)
	if err != nil {
		return connUnknown, err.Error()
	}
	defer a.Release()
	b, err := pool.Acquire(ctx)
	if err != nil {
		return connUnknown, err.Error()
	}
	defer b.Release()
	for range poolerProbeRounds {
		verdict, evidence = probeRound(ctx, a.Conn(), b.Conn())
		if verdict != connSession {
			return verdict, evidence
		}
	}
	return verdict, evidence
}

func probeRound(ctx context.Context, a, b *pgx.Conn) (verdict, evidence string) {
	pid := func(c *pgx.Conn) (uint32, error) {
		qctx, cancel := context.WithTimeout(ctx, poolerProbeTimeout)
		defer cancel()
		var p uint32
		err := c.QueryRow(qctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&p)
		return p, err
	}
	p1, err := pid(a)
	if err != nil {
		return connUnknown, err.Error()
	}
	bctx, cancel := context.WithTimeout(ctx, poolerProbeTimeout)
	defer cancel()
	if _, err := b.Exec(bctx, "BEGIN", pgx.QueryExecModeSimpleProtocol); err != nil {
		if strings.Contains(err.Error(), "statement pooling") {
			return connStatement, err.Error()
		}
		return connUnknown, err.Error()
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), poolerProbeTimeout)
		defer cancel()
		_, _ = b.Exec(rctx, "ROLLBACK", pgx.QueryExecModeSimpleProtocol)
	}()
	pb, err := pid(b)
	if err != nil {
		return connUnknown, err.Error()
	}
	if pb == p1 {
		return connTransaction, fmt.Sprintf("another connection's transaction ran in server process %d, which had just run this connection's statement", p1)
	}
	p2, err := pid(a)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return connTransaction, fmt.Sprintf("a statement waited %s for another connection's open transaction", poolerProbeTimeout)
	case err != nil:
		return connUnknown, err.Error()
	case p2 != p1:
		return connTransaction, fmt.Sprintf("two statements of one connection ran in server processes %d and %d", p1, p2)
	}
	return connSession, fmt.Sprintf("server process %d throughout", p1)
}

// checkConnection runs detectPooler at start and says what it found: a transaction
// or statement pooler is a configuration error (exit 2) naming --database-url,
// before anything can half-work through it; a probe that could not finish is a
// warning.
func checkConnection(ctx context.Context, pool *pgxpool.Pool, log *zap.Logger) error {
	verdict, evidence := detectPooler(ctx, pool)
	switch verdict {
	case connTransaction, connStatement:
		return usagef("--database-url: the connection goes through a %s (%s); %v. Point it at PostgreSQL or at a pool in session mode",
			verdict, evidence, errPooler)
	case connUnknown:
		log.Warn("could not tell whether the connection goes through a transaction pooler; certworker needs a direct or session-pooled connection",
			zap.String("error", evidence))
	default:
		log.Info("database connection", zap.String("connection", verdict))
	}
	return nil
}
