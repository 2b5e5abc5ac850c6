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

// Publication is the publication of migration 00004 that Logical streams: inserts
// and updates of proxy_domains. It shares Channel's name, so that "certworker_wake"
// is the one name an operator looks for in either mode.
const Publication = "certworker_wake"

// slotPrefix starts the name of every slot Logical creates; the rest is random,
// because slots are global to the server and every instance needs its own.
const slotPrefix = "certworker_wake_"

// domainsTable is the table whose changes can make a domain claimable. The
// publication holds only it; the name is checked anyway, so that a table an
// operator adds to the publication cannot wake the worker.
const domainsTable = "proxy_domains"

// Logical turns the changes of a logical replication stream into Wakes: the second wake
// source (CONTRACT.md §2), chosen with `certworker run --wake logical`. Its methods are
// safe for concurrent use.
//
// Why a second source. NOTIFY has two costs at scale. Every transaction that
// notifies takes, at commit, a lock that is global to the server (PreCommit_Notify
// locks one shared object for every database) and holds it across its WAL flush, so
// the proxy's transactions that queue a domain commit one at a time. And a notification sent while the
// listener is disconnected is gone. A logical replication stream has neither: the
// changes are read from the WAL the proxy's transactions write anyway, and nothing
// on their commit path waits for the reader. In logical mode the wake trigger stops
// calling pg_notify (migration 00004, SetMode), so the proxy pays only for the mode
// in use.
//
// The same contract as the Listener. Logical implements Waker as Listener does: it
// connects once in Start and returns that error, reconnects for ever after with the
// same jittered backoff, emits a SourceReconnect wake-up on every connection (the
// first included) once anything committed from then on is in its stream, merges
// wake-ups in the same mailbox, checks a silent connection with a deadline, and
// exports the same three series (certworker_listener_connected, _reconnects_total,
// and _notifications_total, which counts the transactions that made a row
// claimable). It logs the same messages under the same name, with mode "logical",
// so that alerts written for one mode work for the other. A change-driven wake-up
// has source SourceNotify ("notify"): sources name why the worker looks (a domain
// entered the claimable set, a reconnection, a timer, the poll: CONTRACT.md §6), not
// the transport that said so, so a log query or a dashboard keyed on source works
// in both modes.
//
// What wakes. pgoutput sends the new tuple of every insert and update of
// proxy_domains (the publication). Without REPLICA IDENTITY FULL it does not send
// the old one, so the waker cannot tell a row entering the claimable set (verified,
// acme, pending) from one that was in it already: it wakes for every transaction
// that writes at least one row whose new tuple is claimable. That is more wake-ups
// than the NOTIFY trigger sends (the worker's own failure going back to pending, a
// hand-back, an edit of a pending row), never fewer, and it is correct because the
// claim query is the only judge: a spurious wake-up costs one pass that claims
// nothing, and a pass that claims nothing writes nothing, so it cannot feed itself.
// REPLICA IDENTITY FULL would let the waker compare, at the price of the whole old
// row in the WAL of every update the proxy makes, the kind of write-path cost this
// mode exists to remove. One wake-up per transaction, when its commit arrives: a
// statement that verifies 1,000 domains wakes each instance once, as NOTIFY does,
// and a transaction that rolls back wakes nobody.
//
// The slot is temporary. Each connection creates a TEMPORARY logical replication
// slot with a random name and streams from it. PostgreSQL drops a temporary slot
// when its session ends, however it ends: Stop, a crash or a kill -9 of the worker
// (the kernel closes the socket), a pg_terminate_backend, a network partition once
// the server notices it (wal_sender_timeout, 60 s by default). So a worker that is
// gone never makes the server keep WAL for it, with no max_slot_wal_keep_size, no
// operator and no cleanup job. While the session lives, the waker confirms
// everything it has received at least every Options.PingAfter, so the slot holds
// back only what decoding the transactions still open needs (its restart point
// moves at the records of running transactions the server writes every 15 s and at
// checkpoints).
//
// A named, persistent slot would keep its position across disconnections so that
// nothing is missed, which a wake-up source does not need: the claim query is the
// judge, and every connection starts with a catch-up pass (SourceReconnect) that
// finds whatever became due while the waker was away. And it would cost what the
// issue rules out: a worker stopped or scaled down for good would leave its slot
// holding WAL until the disk fills, or until max_slot_wal_keep_size invalidates it,
// a setting the worker cannot count on.
//
// The temporary slot's price is paid at each connection: creating a logical slot
// waits until every transaction that had written something when it started has
// ended (the slot needs a consistent point), so a session left idle in such a
// transaction holds up a (re)connection, each attempt bounded by
// Options.ConnectTimeout.
//
// What the server must allow: wal_level = logical (a restart), a role with the
// REPLICATION attribute (the pool's, or Options.Replication's: a role with it can
// decode every table's changes in the database whatever its grants, so it is
// better kept apart from the role that writes), a free replication slot and WAL
// sender per instance (max_replication_slots and max_wal_senders, 10 each by
// default), and the
// publication of migration 00004. Start fails with a *SetupError, one line naming
// the setting to change, when one is missing. Each instance's WAL sender decodes
// the server's whole WAL (the publication filters after decoding), and wal_level =
// logical itself makes every write log a little more.
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

// NewLogical returns a logical waker that connects with pool's configuration. It
// does not connect: Start does. The Options mean what they mean for a Listener; a
// silent stream is checked by asking the server for a reply after PingAfter.
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

// Start connects, creates its slot, starts streaming, emits a SourceReconnect
// wake-up, and keeps the stream up in a goroutine until Stop is called or ctx is
// cancelled. It returns the error of that first attempt, a *SetupError where the
// server lacks something this mode needs, and then nothing is left running; it
// returns ErrStarted if the waker is already running.
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

// Stop ends the waker and waits until its goroutine has finished and its
// connection is closed, which drops its slot. It has Listener.Stop's guarantees.
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
