package listener

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Channel is the notification channel the wake trigger sends on (docs/reference.md,
// "Notification channels"); the proxy's database and the worker must agree on it.
const Channel = "certworker_wake"

// Defaults for Options. Every instance must be listening within 5 s of a failover's
// promotion (docs/high-availability.md, "Failover"): DefaultHostConnectTimeout and
// DefaultBackoffMax are chosen for it.
const (
	// DefaultPingAfter is how long the connection may stay silent before it is
	// checked. Short enough to find a half-open connection quickly, long enough that
	// an idle worker costs the server one trivial query every 10 s.
	DefaultPingAfter = 10 * time.Second
	// DefaultPingTimeout is the deadline of that check. A live server on a loaded
	// host answers SELECT in milliseconds; 5 s only expires when nothing is there.
	DefaultPingTimeout = 5 * time.Second
	// DefaultConnectTimeout bounds one connection attempt as a whole: every host of
	// a multi-host URL, LISTEN, and in logical mode the slot's creation. Without it a
	// blackholed host holds an attempt for the kernel's TCP timeout, minutes, and
	// Start with it.
	DefaultConnectTimeout = 10 * time.Second
	// DefaultHostConnectTimeout bounds the connection to one host (dial, TLS,
	// authentication) where the connection string sets no connect_timeout: pgx
	// applies it to each host of a multi-host URL in turn. A dead primary listed
	// first (a failover's usual state) then costs each try 2 s before the next host,
	// the new primary, is asked: a try and the backoff after it fit in the 5 s. The
	// same figure as the pool's (queue.HostConnectTimeout), so that both find the new
	// primary together.
	DefaultHostConnectTimeout = 2 * time.Second
	// DefaultBackoffMin is the first reconnection delay: a terminated backend or a
	// fast failover is back in about a tenth of a second.
	DefaultBackoffMin = 100 * time.Millisecond
	// DefaultBackoffMax caps the delay, so that after an outage of any length (an HA
	// manager promotes after its own timeout of 30 s or more) the listener tries
	// again within a second of the server's return. A try against a server that is
	// down costs it nothing (refused, or rejected at once by a standby for
	// target_session_attrs), so once a second is cheap.
	DefaultBackoffMax = time.Second
)

// stableAfter is how long a connection must have lasted for its loss to restart the
// backoff from BackoffMin. A connection lost sooner counts as one more failure: a
// server or a proxy in front of it that accepts connections and drops them at once
// is then tried every BackoffMax, not ten times a second.
const stableAfter = time.Minute

// ErrStarted is returned by Start on a Listener that is already running.
var ErrStarted = errors.New("listener: already started")

// Options tunes a Listener. The zero value is the production setting.
type Options struct {
	// Each of these is its Default constant when 0.
	PingAfter          time.Duration // silence before the connection is checked
	PingTimeout        time.Duration // the check's deadline; past it, the connection is lost
	ConnectTimeout     time.Duration // one connection attempt, every host and LISTEN (or the slot)
	HostConnectTimeout time.Duration // one host, where the configuration sets no connect_timeout
	BackoffMin         time.Duration // the first reconnection delay (Listener.backoff)
	BackoffMax         time.Duration // the largest
	// Replication, used by a Logical waker only, configures its replication
	// connection: a role of its own (the one holding REPLICATION, which the pool's
	// then needs not) on the pool's database. nil connects with the pool's
	// configuration. See Logical.
	Replication *pgconn.Config
	// Registerer, if not nil, receives the listener's metrics (newMetrics).
	Registerer prometheus.Registerer
}

func (o Options) withDefaults() Options {
	set := func(d *time.Duration, def time.Duration) {
		if *d <= 0 {
			*d = def
		}
	}
	set(&o.PingAfter, DefaultPingAfter)
	set(&o.PingTimeout, DefaultPingTimeout)
	set(&o.ConnectTimeout, DefaultConnectTimeout)
	set(&o.HostConnectTimeout, DefaultHostConnectTimeout)
	set(&o.BackoffMin, DefaultBackoffMin)
	set(&o.BackoffMax, DefaultBackoffMax)
	if o.BackoffMax < o.BackoffMin {
		o.BackoffMax = o.BackoffMin
	}
	return o
}

// Listener holds a connection that listens on Channel and turns its notifications
// into Wakes. Its methods are safe for concurrent use.
type Listener struct {
	pool  *pgxpool.Pool
	log   *zap.Logger
	opts  Options
	m     *metrics
	wakes *mailbox

	connected atomic.Bool
	// backendPID is the server process of the current connection, 0 while there is
	// none. Read by tests, which terminate it to simulate a lost connection.
	backendPID atomic.Uint32

	// topics are the other channels' consumers (Listen), fixed once started is set.
	topicsMu sync.Mutex
	topics   map[string]Topic
	started  bool
	// connectedOnce is set by the first connection: every later one is a reconnect
	// to the topics.
	connectedOnce atomic.Bool

	// lifecycle holds the goroutine's Start and Stop.
	lifecycle
}

// New returns a Listener that connects with pool's configuration. It does not
// connect: Start does.
func New(pool *pgxpool.Pool, log *zap.Logger, opts Options) *Listener {
	opts = opts.withDefaults()
	return &Listener{
		pool:  pool,
		log:   log.Named("listener"),
		opts:  opts,
		m:     newMetrics(opts.Registerer),
		wakes: newMailbox(),
	}
}

// Wakes is where wake-ups arrive (mailbox). It is never closed.
func (l *Listener) Wakes() <-chan Wake { return l.wakes.ch }

// Connected reports whether the listener holds a live connection that is listening.
// It is false before Start, while reconnecting, and after Stop.
func (l *Listener) Connected() bool { return l.connected.Load() }

// Start connects and listens, emits the catch-up wake-up, and keeps the connection
// up in a goroutine until Stop or the end of ctx (Waker); ErrStarted if it runs.
func (l *Listener) Start(ctx context.Context) error {
	l.topicsMu.Lock()
	l.started = true
	l.topicsMu.Unlock()
	return l.start(ctx, func() (func(context.Context, chan struct{}), error) {
		conn, err := l.connect(ctx)
		if err != nil {
			return nil, fmt.Errorf("listener: %w", err)
		}
		l.up(conn, false, 0)
		return func(ctx context.Context, done chan struct{}) { l.run(ctx, conn, done) }, nil
	})
}

// Stop ends the listener and waits until its connection is closed (lifecycle.stop).
func (l *Listener) Stop() { l.stop() }

// run keeps a listening connection for as long as ctx lasts. conn is the connection
// Start made.
func (l *Listener) run(ctx context.Context, conn *pgx.Conn, done chan struct{}) {
	defer close(done) // first, so that it runs last: Stop waits for the close
	session[*pgx.Conn]{
		log: l.log, serve: l.listen, down: l.down, connect: l.connect, up: l.up, backoff: l.backoff,
	}.keepUp(ctx, conn)
}

// connect opens the dedicated connection and runs LISTEN on it.
//
// It is a connection of its own, made with the pool's configuration, rather than
// one taken out of the pool with Acquire and Hijack (River's way). Acquire waits for
// a free slot when the pool is at MaxConns, so a reconnection would queue behind
// whatever holds the pool's connections, at the very moment the worker most needs
// to know it has missed notifications; and a connection hijacked from the pool is
// one the pool replaces anyway, so both ways cost the server one connection. The
// pool's BeforeConnect and AfterConnect hooks are run here as the pool would run
// them, so credentials that rotate (a BeforeConnect that fetches a token) and
// session setup still apply.
func (l *Listener) connect(ctx context.Context) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, l.opts.ConnectTimeout)
	defer cancel()
	cfg := l.pool.Config() // a deep copy: ours to modify
	if cfg.BeforeConnect != nil {
		if err := cfg.BeforeConnect(ctx, cfg.ConnConfig); err != nil {
			return nil, fmt.Errorf("before connect: %w", err)
		}
	}
	l.opts.boundHosts(&cfg.ConnConfig.Config)
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		// pgx's connect errors name host, port, user and database, never the
		// password, so they are safe to return and log as they are.
		return nil, fmt.Errorf("connect: %w", err)
	}
	if cfg.AfterConnect != nil {
		if err := cfg.AfterConnect(ctx, conn); err != nil {
			l.close(ctx, conn)
			return nil, fmt.Errorf("after connect: %w", err)
		}
	}
	if _, err := conn.Exec(ctx, "LISTEN "+Channel); err != nil {
		l.close(ctx, conn)
		return nil, fmt.Errorf("listen on %s: %w", Channel, err)
	}
	if err := l.listenTopics(ctx, conn, l.connectedOnce.Load()); err != nil {
		l.close(ctx, conn)
		return nil, err
	}
	l.connectedOnce.Store(true)
	return conn, nil
}

// boundHosts gives cfg HostConnectTimeout where it sets no connect_timeout of its
// own (DefaultHostConnectTimeout says why).
func (o Options) boundHosts(cfg *pgconn.Config) {
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = o.HostConnectTimeout
	}
}

// listen waits for notifications on conn until the connection fails or ctx ends,
// checking the connection whenever it has been silent for PingAfter. It returns why
// it stopped.
func (l *Listener) listen(ctx context.Context, conn *pgx.Conn) error {
	for {
		waitCtx, cancel := context.WithTimeout(ctx, l.opts.PingAfter)
		n, err := conn.WaitForNotification(waitCtx)
		silent := waitCtx.Err() != nil
		cancel()
		// pgx may hand back a notification it had buffered together with an error;
		// the notification is still true.
		if n != nil && n.Channel == Channel {
			l.wakes.send(Wake{Source: SourceNotify, At: time.Now()})
			// Counted after the send, so that a count includes every wake-up it
			// implies (the storm test reads the counter to know the burst is in).
			l.m.notifications.Inc()
			l.log.Debug("notification", zap.String("channel", n.Channel), zap.Uint32("sender_pid", n.PID))
		} else if t := l.topics[channelOf(n)]; t != nil {
			if err := t.Notify(ctx, conn, n.Payload); err != nil {
				return fmt.Errorf("%s: %w", n.Channel, err)
			}
		}
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return ctx.Err()
		case silent:
			// Our own deadline, not a failure. pgx ends the wait by setting a deadline
			// on the socket, which leaves the connection usable, so it is checked
			// rather than assumed.
			if err := l.ping(ctx, conn); err != nil {
				return err
			}
		default:
			return fmt.Errorf("wait for notification: %w", err)
		}
	}
}

// ping checks, within PingTimeout, that the server answers and that the session is
// still listening on Channel. The second half costs nothing more and catches a
// session that is not the one that ran LISTEN, as behind a pooler in transaction
// mode, where notifications would never arrive.
func (l *Listener) ping(ctx context.Context, conn *pgx.Conn) error {
	ctx, cancel := context.WithTimeout(ctx, l.opts.PingTimeout)
	defer cancel()
	var listening bool
	err := conn.QueryRow(ctx,
		"SELECT $1::text[] <@ ARRAY(SELECT pg_listening_channels()::text)", l.channels()).Scan(&listening)
	if err != nil {
		return fmt.Errorf("ping after %s of silence: %w", l.opts.PingAfter, err)
	}
	if !listening {
		return fmt.Errorf("ping after %s of silence: session is no longer listening on %s and its topics' channels", l.opts.PingAfter, Channel)
	}
	l.log.Debug("ping", zap.Duration("silent_for", l.opts.PingAfter))
	return nil
}

// up records a new listening connection, after LISTEN succeeded, and emits the
// catch-up wake-up.
func (l *Listener) up(conn *pgx.Conn, reconnect bool, downFor time.Duration) {
	l.backendPID.Store(conn.PgConn().PID())
	l.connected.Store(true)
	l.m.connected.Set(1)
	if reconnect {
		l.m.reconnects.Inc()
		l.log.Info("listener reconnected", zap.String("channel", Channel), zap.Duration("down_for", downFor))
	} else {
		l.log.Info("listener connected", zap.String("channel", Channel))
	}
	l.wakes.send(Wake{Source: SourceReconnect, At: time.Now()})
}

// down records the loss of conn and closes it.
func (l *Listener) down(ctx context.Context, conn *pgx.Conn) {
	for _, t := range l.topics {
		t.Disconnected(ctx.Err() != nil)
	}
	l.connected.Store(false)
	l.m.connected.Set(0)
	l.backendPID.Store(0)
	l.close(ctx, conn)
}

// close closes conn within PingTimeout, also once ctx is cancelled: the server
// should see a Terminate rather than a dropped socket where it can, but a dead peer
// must not hold up Stop.
func (l *Listener) close(ctx context.Context, conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.opts.PingTimeout)
	defer cancel()
	_ = conn.Close(ctx)
}

// backoff is the delay before reconnection attempt number failures+1: BackoffMin
// doubled per earlier failure, capped at BackoffMax, then drawn at random from its
// upper half ("equal jitter"). The random half spreads out instances that lost the
// same server; the fixed half keeps the curve from collapsing towards zero.
func (l *Listener) backoff(failures int) time.Duration {
	d := l.opts.BackoffMin
	for i := 0; i < failures && d < l.opts.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, l.opts.BackoffMax)
	return d/2 + rand.N(d-d/2+1)
}

// sleep waits for d, and reports false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// channelOf is n's channel, "" for none.
func channelOf(n *pgconn.Notification) string {
	if n == nil {
		return ""
	}
	return n.Channel
}
