package listener

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// modeLogical is the "mode" field of the logical waker's logs (the --wake value).
const modeLogical = "logical"

// Publication is the publication `certworker migrate` creates that Logical streams:
// inserts and updates of proxy_domains. It shares Channel's name, so that
// "certworker_wake" is the one name an operator looks for in either mode.
const Publication = "certworker_wake"

// slotPrefix starts the name of every slot Logical creates; the rest is random,
// because slots are global to the server and every instance needs its own.
const slotPrefix = "certworker_wake_"

// domainsTable is the table whose changes can make a domain claimable. The
// publication holds only it; the name is checked anyway, so that a table an
// operator adds to the publication cannot wake the worker.
const domainsTable = "proxy_domains"

// Logical turns the changes of a logical replication stream into Wakes: the wake
// source of `certworker run --wake logical` (docs/internals.md, "Wake-up source":
// why, and what the server must allow). Its methods are safe for concurrent use.
//
// Logical is a Waker with the Listener's session (reconnect, backoff, catch-up), its
// mailbox, its metrics (the notifications counter counts the transactions that made
// a row claimable) and its log messages, with mode "logical", so that alerts and
// dashboards work in both modes. A change-driven wake-up has source SourceNotify.
//
// What wakes: a transaction's commit, once, when it wrote at least one row of
// proxy_domains whose new tuple is claimable (matches). Without REPLICA IDENTITY FULL,
// which would put the whole old row in the WAL of every update the proxy makes,
// pgoutput sends no old tuple, so a row entering the set cannot be told from one
// already in it: more wake-ups than the trigger's, never fewer, and a spurious one
// costs a pass that claims and writes nothing, so it cannot feed itself. A rolled
// back transaction wakes nobody.
//
// The slot is TEMPORARY, with a random name: PostgreSQL drops it when its session
// ends, however it ends, so a worker that is gone never makes the server keep WAL.
// While it lives the waker confirms what it received every Options.PingAfter, so
// the slot holds back only what the open transactions need. Its price is paid at
// each connection: creating it waits for the transactions that had written
// something to end (startStream). Start fails with a *SetupError, naming the setting
// to change, when the server lacks something this mode needs.
type Logical struct {
	pool  *pgxpool.Pool
	log   *zap.Logger
	opts  Options
	m     *metrics
	wakes *mailbox

	connected atomic.Bool
	// backendPID is the WAL sender of the current connection, 0 while there is
	// none. Read by tests, which terminate it to simulate a lost connection.
	backendPID atomic.Uint32

	// lifecycle holds the goroutine's Start and Stop.
	lifecycle
}

// NewLogical returns a logical waker that connects with pool's configuration, or
// Options.Replication. It does not connect: Start does.
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

// Connected reports whether the waker is streaming. It is false before Start, while
// reconnecting, and after Stop.
func (lg *Logical) Connected() bool { return lg.connected.Load() }

// Start connects, creates its slot and streams, as Listener.Start does; a
// *SetupError where the server lacks something this mode needs.
func (lg *Logical) Start(ctx context.Context) error {
	return lg.start(ctx, func() (func(context.Context, chan struct{}), error) {
		s, err := lg.connect(ctx)
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

// Stop ends the waker and waits until its slot is gone (lifecycle.stop, waitSlotGone).
func (lg *Logical) Stop() { lg.stop() }

// stream is one replication connection and what is known about it.
type stream struct {
	conn *pgconn.PgConn
	slot string
	// pos is the WAL position up to which everything has been received and acted
	// on; confirmed to the server so that the slot holds back nothing older.
	pos pglogrepl.LSN
	// rels maps the relation ids the server has described to where the columns
	// the waker reads are in their tuples.
	rels map[uint32]relation
	// claimable is set by a change in the current transaction whose new tuple is
	// in the claimable set.
	claimable bool
}

// run keeps a stream up for as long as ctx lasts. s is the stream Start made.
func (lg *Logical) run(ctx context.Context, s *stream, done chan struct{}) {
	defer close(done)
	session[*stream]{
		log: lg.log, serve: lg.stream, down: lg.down, connect: lg.connect, up: lg.up, backoff: lg.backoff,
	}.keepUp(ctx, s)
}

// backoff is the Listener's curve, computed by its code so that the two modes
// cannot drift apart.
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

// slotGoneTimeout bounds the wait for a stopped waker's slot to go: a WAL sender ends
// within milliseconds of its connection's close, and a server that cannot be asked
// must not hold up Stop for longer.
const slotGoneTimeout = 10 * time.Second

// waitSlotGone waits until the server has dropped slot, so that Stop returns only once
// nothing of the waker is left on the server. PostgreSQL drops a temporary slot when
// its WAL sender ends, which is shortly after the connection closes, not at once; until
// then the slot holds its database, and a DROP DATABASE (a test's cleanup, an operator's)
// fails with "is used by an active logical replication slot" (SQLSTATE 55006).
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

// closeConn closes conn within PingTimeout, also once ctx is cancelled, as
// Listener.close does.
func (lg *Logical) closeConn(ctx context.Context, conn *pgconn.PgConn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lg.opts.PingTimeout)
	defer cancel()
	_ = conn.Close(ctx)
}
