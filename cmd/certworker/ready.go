package main

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/singleflight"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/queue"
)

// readyTimeout bounds /readyz's checks: long enough for a connection that tries a
// dead first host of a multi-host URL (the per-host connect timeout, 2 s) before the
// live one.
const readyTimeout = 5 * time.Second

// readiness answers /readyz with one check at a time: the probes that come while a
// check runs wait for its answer instead of starting checks of their own. A prober
// that asks often, or many probers at once, thus costs the database one session at
// most (probeSession). Without it, after a failover, when each new connection first
// waits out the dead host, probes every 100 ms queued some fifty checks, each wanting
// two or three connections, on the worker's pool of four.
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

// probeSession is /readyz's own database session, kept between checks: the worker's
// pool's connection settings and session bounds (lease is the worker's), without the
// warm-up of the worker's statements, which a check never runs. Made when a check
// first needs it; a kept session that does not answer a ping within idlePingTimeout
// is dropped without waiting for its close, and a new one is made in the same check.
//
// Not a connection of the worker's pool: a check there waited behind the worker's own
// steps, so that an instance at work, or one whose steps all waited on the dead
// primary after a failover, was reported not ready while the database answered (an
// instance of the failover test answered "no connection of the pool: 4 of 4 in use"
// five seconds after the promotion). An orchestrator that takes such an instance out
// of service also stops sending it the CA's HTTP-01 requests. Nor a pool of its own:
// pgx closes a connection whose server went silent by asking that server to cancel
// and reading until it answers, for up to 15 s, and the pool keeps the connection's
// slot until then; behind it a check would wait out those 15 s after every failover.
type probeSession struct {
	cfg  *pgxpool.Config // the session's connection and set-up (queue.ConnectSession)
	mu   sync.Mutex
	conn *pgx.Conn
}

func newProbeSession(worker *pgxpool.Pool, lease time.Duration) *probeSession {
	cfg := worker.Config()
	cfg.AfterConnect = nil
	queue.ConfigureSession(cfg, queue.WorkerSession(lease))
	return &probeSession{cfg: cfg}
}

// get returns the session, once it has answered a ping, or a new one; holding it
// until release.
func (p *probeSession) get(ctx context.Context) (*pgx.Conn, error) {
	p.mu.Lock()
	if p.conn != nil {
		pctx, cancel := context.WithTimeout(ctx, idlePingTimeout)
		err := p.conn.Ping(pctx)
		cancel()
		if err == nil {
			return p.conn, nil
		}
		p.dropLocked()
	}
	conn, err := queue.ConnectSession(ctx, p.cfg)
	if err != nil {
		p.mu.Unlock()
		return nil, err
	}
	p.conn = conn
	return conn, nil
}

// release lets the next check have the session; a session that pgx closed (a
// statement cut off by the check's deadline) is dropped.
func (p *probeSession) release() {
	if p.conn != nil && p.conn.IsClosed() {
		p.dropLocked()
	}
	p.mu.Unlock()
}

// dropLocked forgets the session and closes it in the background: a close that
// waits on a silent server is not the next check's to wait for.
func (p *probeSession) dropLocked() {
	go queue.CloseQuickly(p.conn)
	p.conn = nil
}

// Close closes the session, if there is one.
func (p *probeSession) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		queue.CloseQuickly(p.conn)
		p.conn = nil
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
// second CA's issuer, nil for none. Its checks share the probes' session: it answers
// (the database answers), and the stored accounts are read on it.
func notReady(ctx context.Context, probes *probeSession, wk workerState, issuer, second *acme.Issuer) string {
	conn, err := probes.get(ctx)
	if err != nil {
		return "database unreachable: " + rootCause(err)
	}
	defer probes.release()
	if !wk.Ready() {
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
