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

	"github.com/certworker/certworker/queue"
)

// Channel is the notification channel the wake trigger sends on (docs/reference.md).
const Channel = "certworker_wake"

// Defaults for Options, chosen so that every instance listens again within 5 s of a
// failover's promotion (docs/high-availability.md, "Failover").
const (
	// DefaultPingAfter is how long the connection may stay silent before it is checked.
	DefaultPingAfter = 10 * time.Second
	// DefaultPingTimeout is that check's deadline; a live server answers in milliseconds.
	DefaultPingTimeout = 5 * time.Second
	// DefaultConnectTimeout bounds a whole attempt (every host, LISTEN, the slot). At
	// Start, hosts that only timed out are tried again within it (firstConnect).
	DefaultConnectTimeout = 10 * time.Second
	// DefaultHostConnectTimeout bounds each host of a URL without connect_timeout, so
	// that a dead primary listed first leaves time to ask the new one, as the pool does.
	DefaultHostConnectTimeout = 2 * time.Second
	// DefaultBackoffMin is the first reconnection delay.
	DefaultBackoffMin = 100 * time.Millisecond
	// DefaultBackoffMax caps the delay: back within a second of the server's return.
	DefaultBackoffMax = time.Second
)

// stableAfter is how long a connection must last for its loss to restart the backoff
// from BackoffMin, so that a server that drops every connection at once is not hammered.
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
	// Replication configures Logical's replication connection; nil uses the pool's.
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
	// backendPID is the current connection's server process, 0 without one.
	backendPID atomic.Uint32

	// topics are the other channels' consumers (Listen), fixed once started is set.
	topicsMu sync.Mutex
	topics   map[string]Topic
	started  bool
	// connectedOnce makes every later connection a reconnect to the topics.
	connectedOnce atomic.Bool

	lifecycle
}

// New returns a Listener on pool's configuration. Start connects.
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
func (l *Listener) Connected() bool { return l.connected.Load() }

// Start connects and listens, emits the catch-up wake-up, and keeps the connection
// up in a goroutine until Stop or the end of ctx (Waker); ErrStarted if it runs.
func (l *Listener) Start(ctx context.Context) error {
	l.topicsMu.Lock()
	l.started = true
	l.topicsMu.Unlock()
	return l.start(ctx, func() (func(context.Context, chan struct{}), error) {
		conn, err := firstConnect(ctx, l.log, l.opts.ConnectTimeout, l.connect)
		if err != nil {
			return nil, fmt.Errorf("listener: %w", err)
		}
		l.up(conn, false, 0)
		return func(ctx context.Context, done chan struct{}) { l.run(ctx, conn, done) }, nil
	})
}

// Stop ends the listener and waits until its connection is closed (lifecycle.stop).
func (l *Listener) Stop() { l.stop() }

// run keeps a listening connection, starting with conn, until ctx ends.
func (l *Listener) run(ctx context.Context, conn *pgx.Conn, done chan struct{}) {
	defer close(done) // first, so that it runs last: Stop waits for the close
	session[*pgx.Conn]{
		log: l.log, serve: l.listen, down: l.down, connect: l.connect, up: l.up, backoff: l.backoff,
	}.keepUp(ctx, conn)
}

// connect opens the listener's own connection and runs LISTEN on it. It is not one
// acquired from the pool, so that a reconnection never waits for a free slot in a
// full pool; the pool's BeforeConnect and AfterConnect hooks run as the pool would.
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
		// pgx's connect errors never name the password.
		return nil, fmt.Errorf("connect: %w", err)
	}
	if cfg.AfterConnect != nil {
		// Its own session: not warmed up for the pool's statements (queue.SessionOfItsOwn).
		if err := cfg.AfterConnect(queue.SessionOfItsOwn(ctx), conn); err != nil {
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

// boundHosts sets HostConnectTimeout where cfg has no connect_timeout.
func (o Options) boundHosts(cfg *pgconn.Config) {
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = o.HostConnectTimeout
	}
}

// listen waits for notifications on conn until it fails or ctx ends, and returns why.
func (l *Listener) listen(ctx context.Context, conn *pgx.Conn) error {
	for {
		waitCtx, cancel := context.WithTimeout(ctx, l.opts.PingAfter)
		n, err := conn.WaitForNotification(waitCtx)
		silent := waitCtx.Err() != nil
		cancel()
		// A notification pgx returns with an error is still true.
		if n != nil && n.Channel == Channel {
			l.wakes.send(Wake{Source: SourceNotify, At: time.Now()})
			// Counted after the send, so that a count includes every wake-up it implies.
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
			// Our own deadline, which leaves the connection usable: check it.
			if err := l.ping(ctx, conn); err != nil {
				return err
			}
		default:
			return fmt.Errorf("wait for notification: %w", err)
		}
	}
}

// ping checks within PingTimeout that the server answers and that the session still
// listens on every channel, which behind a pooler in transaction mode it would not.
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

// up records a new listening connection and emits the catch-up wake-up.
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

// close closes conn within PingTimeout, also once ctx is cancelled, so that a dead
// peer cannot hold up Stop.
func (l *Listener) close(ctx context.Context, conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.opts.PingTimeout)
	defer cancel()
	_ = conn.Close(ctx)
}

// backoff is the delay before attempt failures+1: BackoffMin doubled per failure, up
// to BackoffMax, drawn from its upper half (equal jitter) to spread out instances.
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

func channelOf(n *pgconn.Notification) string {
	if n == nil {
		return ""
	}
	return n.Channel
}
