package listener

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// modeLogical is the "mode" field of the logical waker's logs.
const modeLogical = "logical"

// Publication is what Logical streams: proxy_domains' inserts and updates.
const Publication = "certworker_wake"

// slotPrefix starts every slot's name; the rest is random, one slot per instance.
const slotPrefix = "certworker_wake_"

// domainsTable is the one table whose changes wake, whatever else is published.
const domainsTable = "proxy_domains"

// Logical turns the changes of a logical replication stream into Wakes for
// `certworker run --wake logical` (docs/internals.md, "Wake-up source"), with the
// Listener's session, metrics and log messages. A transaction that wrote a claimable
// row wakes once, at its commit, with SourceNotify. Start fails with a *SetupError
// naming the setting to change when the server lacks something this mode needs.
type Logical struct {
	pool  *pgxpool.Pool
	log   *zap.Logger
	opts  Options
	m     *metrics
	wakes *mailbox

	connected atomic.Bool
	// backendPID is the current WAL sender, 0 without one.
	backendPID atomic.Uint32

	// announced holds the ids of the claimable commits not yet taken by Announced.
	announcedMu sync.Mutex
	announced   []uint32

	lifecycle
}

// NewLogical returns a logical waker on pool's configuration, or Options.Replication.
func NewLogical(pool *pgxpool.Pool, log *zap.Logger, opts Options) *Logical {
	opts = opts.withDefaults()
	return &Logical{
		pool:  pool,
		log:   log.Named("listener").With(zap.String("mode", modeLogical)),
		opts:  opts,
		m:     newMetrics(opts.Registerer),
		wakes: newMailbox(),
	}
}

// Wakes is where wake-ups arrive; see Listener.Wakes.
func (lg *Logical) Wakes() <-chan Wake { return lg.wakes.ch }

// Connected reports whether the waker is streaming.
func (lg *Logical) Connected() bool { return lg.connected.Load() }

// Start connects, creates its slot and streams, as Listener.Start does (*SetupError).
func (lg *Logical) Start(ctx context.Context) error {
	return lg.start(ctx, func() (func(context.Context, chan struct{}), error) {
		s, err := firstConnect(ctx, lg.log, lg.opts.ConnectTimeout, lg.connect)
		if err != nil {
			var se *SetupError
			if errors.As(err, &se) {
				return nil, se
			}
			return nil, fmt.Errorf("listener: %w", err)
		}
		lg.up(s, false, 0)
		return func(ctx context.Context, done chan struct{}) { lg.run(ctx, s, done) }, nil
	})
}

// maxAnnounced bounds the ids kept for a worker that stopped taking them; the oldest
// go first, and a worker that looks at the queue again sees those long since.
const maxAnnounced = 1024

// Announced takes the ids of the claimable commits announced since the last call.
func (lg *Logical) Announced() []uint32 {
	lg.announcedMu.Lock()
	defer lg.announcedMu.Unlock()
	out := lg.announced
	lg.announced = nil
	return out
}

// announce records xid, a claimable commit, before its wake-up is sent.
func (lg *Logical) announce(xid uint32) {
	lg.announcedMu.Lock()
	defer lg.announcedMu.Unlock()
	if len(lg.announced) >= maxAnnounced {
		lg.announced = append(lg.announced[:0], lg.announced[len(lg.announced)-maxAnnounced+1:]...)
	}
	lg.announced = append(lg.announced, xid)
}

// Stop ends the waker and waits until its slot is gone (lifecycle.stop, waitSlotGone).
func (lg *Logical) Stop() { lg.stop() }

// stream is one replication connection and what is known about it.
type stream struct {
	conn *pgconn.PgConn
	slot string
	// pos is the WAL position up to which everything has been received and acted on.
	pos pglogrepl.LSN
	// rels maps relation ids to where the columns the waker reads are.
	rels map[uint32]relation
	// claimable is set once the current transaction wrote a claimable row.
	claimable bool
	// xid is the current transaction's id.
	xid uint32
}

// run keeps a stream up for as long as ctx lasts. s is the stream Start made.
func (lg *Logical) run(ctx context.Context, s *stream, done chan struct{}) {
	defer close(done)
	session[*stream]{
		log: lg.log, serve: lg.stream, down: lg.down, connect: lg.connect, up: lg.up, backoff: lg.backoff,
	}.keepUp(ctx, s)
}

// backoff is the Listener's curve, computed by its code.
func (lg *Logical) backoff(failures int) time.Duration {
	return (&Listener{opts: lg.opts}).backoff(failures)
}

// up records a new stream and emits the catch-up wake-up.
func (lg *Logical) up(s *stream, reconnect bool, downFor time.Duration) {
	lg.backendPID.Store(s.conn.PID())
	lg.connected.Store(true)
	lg.m.connected.Set(1)
	fields := []zap.Field{zap.String("publication", Publication), zap.String("slot", s.slot)}
	if reconnect {
		lg.m.reconnects.Inc()
		lg.log.Info("listener reconnected", append(fields, zap.Duration("down_for", downFor))...)
	} else {
		lg.log.Info("listener connected", fields...)
	}
	lg.wakes.send(Wake{Source: SourceReconnect, At: time.Now()})
}

// down records the loss of s and closes its connection, which drops its slot.
func (lg *Logical) down(ctx context.Context, s *stream) {
	lg.connected.Store(false)
	lg.m.connected.Set(0)
	lg.backendPID.Store(0)
	lg.closeConn(ctx, s.conn)
	if ctx.Err() != nil {
		lg.waitSlotGone(ctx, s.slot)
	}
}

// slotGoneTimeout bounds Stop's wait for the slot to go when the server is not there.
const slotGoneTimeout = 10 * time.Second

// waitSlotGone waits until the server has dropped slot, shortly after its WAL sender
// ends: until then the slot holds the database, and DROP DATABASE fails (55006).
func (lg *Logical) waitSlotGone(ctx context.Context, slot string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), slotGoneTimeout)
	defer cancel()
	for {
		var present bool
		err := lg.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, slot).Scan(&present)
		if err == nil && !present {
			return
		}
		if ctx.Err() != nil {
			lg.log.Warn("replication slot still present after the waker stopped; the server drops it when its WAL sender ends",
				zap.String("slot", slot), zap.Error(err))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// closeConn closes conn as Listener.close does.
func (lg *Logical) closeConn(ctx context.Context, conn *pgconn.PgConn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lg.opts.PingTimeout)
	defer cancel()
	_ = conn.Close(ctx)
}
