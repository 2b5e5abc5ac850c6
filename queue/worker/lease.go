package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// dbHealth is what the worker has seen of the database lately: whether it answered
// its last statement, and since when it has answered them all. A refusal (lock
// timeout, constraint, statement_timeout) is an answer; only no answer, or "cannot
// serve now", counts as away, so no recurring failure keeps the reclaim's gate shut.
type dbHealth struct {
	mu      sync.Mutex
	down    bool
	upSince time.Time
	lastOK  time.Time
	// silence is the longest gap between successes that still counts as reachable all
	// along: half a lease. A longer one means the process was paused.
	silence time.Duration
}

func newDBHealth(lease time.Duration) dbHealth {
	now := time.Now()
	return dbHealth{upSince: now, lastOK: now, silence: lease / 2}
}

func (h *dbHealth) ok() {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	if h.down || now.Sub(h.lastOK) > h.silence {
		h.down, h.upSince = false, now
	}
	h.lastOK = now
}

// failed records a failed statement: the database is away unless it answered.
func (h *dbHealth) failed(err error) {
	if issuing.DatabaseAnswered(err) {
		h.ok()
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.down = true
}

// upFor is how long statements have succeeded without a failure or a silence.
func (h *dbHealth) upFor() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.down || time.Since(h.lastOK) > h.silence {
		return 0
	}
	return time.Since(h.upSince)
}

// heartbeatLoop renews this instance's leases every third of a lease, on its own
// timer and session (heartbeatConn), so no pass or busy pool delays a renewal. It
// runs until ctx ends, after the shutdown.
func (w *Worker) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(w.cfg.Queue.Lease / 3)
	defer t.Stop()
	defer w.hb.close()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.renewLeases(ctx)
		}
	}
}

// renewLeases renews the leases of the orders in flight, moves their deadlines, and
// stops those whose claim is gone or whose lease ran out. With no order it still
// makes the round trip, for dbHealth.
func (w *Worker) renewLeases(ctx context.Context) {
	tokens := w.orders.tokens()
	// Taken before the statement: the database stamps the lease later.
	sent := time.Now()
	leases, err := w.hb.renew(ctx, w.cfg.Queue, tokens)
	if err != nil {
		w.health.failed(err)
		w.m.heartbeatFailed()
		// Orders stop at their deadline, before another instance can reclaim their rows.
		w.logDBError("renew leases", err)
		return
	}
	w.health.ok()
	if len(tokens) > 0 {
		// Each renewal, for reading a lease that ran out afterwards.
		w.log.Debug("leases renewed", zap.Int("orders", len(tokens)), zap.Int("renewed", len(leases.Renewed)),
			zap.Duration("took", time.Since(sent)))
	}
	for _, t := range leases.Renewed {
		if o := w.orders.get(t); o != nil {
			o.deadline.Renewed(sent)
		}
	}
	for _, t := range leases.Expired {
		if o := w.orders.get(t); o != nil {
			o.cancel(errLeaseDeadline)
			w.log.Warn("lease ran out before it could be renewed; stopping the order and handing the claim back",
				issuing.LogDomain(o.claim.Domain, o.claim.ID, o.claim.TenantID))
		}
	}
	for _, t := range leases.Busy {
		if o := w.orders.get(t); o != nil {
			w.log.Debug("lease not renewed: another transaction holds the domain's row; trying again at the next heartbeat",
				issuing.LogDomain(o.claim.Domain, o.claim.ID, o.claim.TenantID),
				zap.Duration("deadline_in", o.deadline.Left()))
		}
	}
	for _, t := range leases.Lost {
		o := w.orders.get(t)
		if o == nil {
			continue // finished meanwhile
		}
		if o.finishing.Load() {
			// Most likely its own result's write, committed before the loop forgot it.
			w.log.Debug("lease not renewed: the order is writing its result, which is fenced by its token",
				issuing.LogDomain(o.claim.Domain, o.claim.ID, o.claim.TenantID))
			continue
		}
		o.lost.Store(true)
		o.cancel(errLost)
		w.log.Warn("claim lost: another instance or an operator took this domain; stopping the order",
			issuing.LogDomain(o.claim.Domain, o.claim.ID, o.claim.TenantID))
	}
}

// confirmRetry is the pause between tries of confirmClaim: the order waits, and a
// promotion is over within seconds.
const confirmRetry = 250 * time.Millisecond

// confirmClaim implements issuing.Request's ConfirmClaim: the lease renewed under
// the claim's token with a third of a lease left, on the database's clock and the
// local deadline. An error or a locked row is tried again while the local deadline
// allows; then the error wraps issuing.ErrLeaseDeadline. A lost claim stops the
// order as lost.
func (w *Worker) confirmClaim(ctx context.Context, o *order) error {
	third := w.cfg.Queue.Lease / 3
	log := w.log.With(issuing.LogDomain(o.claim.Domain, o.claim.ID, o.claim.TenantID))
	for try := 1; ; try++ {
		budget := o.deadline.Left() - third
		if budget <= 0 {
			return fmt.Errorf("the claim could not be confirmed before the finalize with a third of the lease left: %w", issuing.ErrLeaseDeadline)
		}
		// Taken before the statement, as the heartbeat's.
		sent := time.Now()
		sctx, cancel := context.WithTimeout(ctx, min(budget, w.stepTimeout()))
		left, err := w.q.ConfirmClaim(sctx, o.claim.Token)
		cancel()
		switch {
		case err == nil && left >= third:
			w.health.ok()
			o.deadline.Renewed(sent)
			return nil
		case err == nil:
			return fmt.Errorf("the claim's lease was renewed with only %s left on the database's clock: %w",
				left.Round(time.Millisecond), issuing.ErrLeaseDeadline)
		case errors.Is(err, issuing.ErrClaimLost):
			w.health.ok()
			o.lost.Store(true)
			o.cancel(errLost)
			log.Warn("claim lost before the finalize: the database does not hold it (another instance or an operator took the domain, or a failover lost the claim); nothing is sent to the CA")
			return err
		case errors.Is(err, issuing.ErrLeaseDeadline):
			w.health.ok()
			return err
		case ctx.Err() != nil:
			return fmt.Errorf("confirm the claim before the finalize: %w", context.Cause(ctx))
		}
		if !errors.Is(err, issuing.ErrClaimBusy) {
			w.health.failed(err)
		}
		// The first failure is logged; retries are for debugging.
		logTry := log.Debug
		if try == 1 {
			logTry = log.Info
		}
		logTry("could not confirm the claim before the finalize; trying again", zap.Error(err), zap.Int("attempt", try),
			zap.Duration("retry_in", confirmRetry), zap.Duration("deadline_in", o.deadline.Left()))
		t := time.NewTimer(confirmRetry)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

// heartbeatConn is the heartbeat's own session, outside the pool, so a renewal never
// waits for a pooled connection. Reconnected once pgx has closed it; every wait is
// bounded. Only the heartbeat uses it.
type heartbeatConn struct {
	cfg  *pgxpool.Config
	conn *pgx.Conn
}

// renew runs queue.Heartbeat for tokens within a third of a lease (and, when the
// server has not answered by then, the quarter lease it is given to end the
// statement), connecting first within a lease if need be (an authentication may be
// slow).
func (h *heartbeatConn) renew(ctx context.Context, qcfg issuing.Config, tokens []string) (queue.Leases, error) {
	if h.conn == nil || h.conn.IsClosed() {
		cctx, cancel := context.WithTimeout(ctx, qcfg.Lease)
		conn, err := h.connect(cctx, qcfg.Lease/3)
		cancel()
		if err != nil {
			return queue.Leases{}, err
		}
		h.conn = conn
	}
	// Its statement_timeout is the same third (connect); past the deadline the server
	// is given the pool's statement_timeout to end it, so the session survives.
	sctx, cancel := context.WithTimeout(queue.WithDeadlineGrace(ctx), qcfg.Lease/3)
	defer cancel()
	leases, err := queue.New(h.conn, qcfg).Heartbeat(sctx, tokens)
	if h.conn.IsClosed() {
		// pgx closes a session it cannot be sure of; one that answered an error is kept.
		h.conn = nil
	}
	return leases, err
}

func (h *heartbeatConn) connect(ctx context.Context, timeout time.Duration) (*pgx.Conn, error) {
	conn, err := queue.ConnectSession(ctx, h.cfg)
	if err != nil {
		return nil, fmt.Errorf("connect the heartbeat's session: %w", err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("SET statement_timeout = %d", max(timeout.Milliseconds(), 1))); err != nil {
		queue.CloseQuickly(conn)
		return nil, fmt.Errorf("set up the heartbeat's session: %w", err)
	}
	return conn, nil
}

func (h *heartbeatConn) close() {
	if h.conn != nil {
		queue.CloseQuickly(h.conn)
		h.conn = nil
	}
}
