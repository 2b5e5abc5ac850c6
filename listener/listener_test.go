package listener

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/certworker/certworker/internal/netrelay"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/queue"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// waitTimeout bounds every wait for something the listener should do "at once". It
// is generous because -race and a busy CI host slow everything down; a test that
// passes only needs the event, not the time.
const waitTimeout = 10 * time.Second

type bundle struct {
	l *Listener
	// pool is on the listener's database, for sending notifications.
	pool *pgxpool.Pool
	dsn  string
	logs *observer.ObservedLogs
	reg  *prometheus.Registry
}

// setup builds a Listener on a fresh database, with its logs captured and its
// metrics on a registry of its own. It does not start it; Stop runs at cleanup.
func setup(t *testing.T, opts Options) *bundle {
	t.Helper()
	pool, dsn := pgtest.NewPool(t)
	return setupWithPool(t, pool, dsn, opts)
}

func setupWithPool(t *testing.T, pool *pgxpool.Pool, dsn string, opts Options) *bundle {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(zapcore.NewTee(core, zaptest.NewLogger(t).Core()))
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	l := New(pool, log, opts)
	t.Cleanup(l.Stop)
	return &bundle{l: l, pool: pool, dsn: dsn, logs: logs, reg: reg}
}

// setupWithConfig is setupWithPool on a pool made from cfg (a test's hooks on the
// sessions), closed when the test ends.
func setupWithConfig(t *testing.T, cfg *pgxpool.Config, dsn string) (*pgxpool.Pool, *bundle) {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, setupWithPool(t, pool, dsn, Options{})
}

// start starts b's listener and consumes the wake-up every connection emits.
func (b *bundle) start(t *testing.T) {
	t.Helper()
	require.NoError(t, b.l.Start(context.Background()))
	require.True(t, b.l.Connected())
	w := waitWake(t, b.l.Wakes())
	require.Equal(t, SourceReconnect, w.Source, "the first connection must ask for a catch-up pass")
}

func (b *bundle) notify(t *testing.T) {
	t.Helper()
	// Outside an explicit transaction: committed at once, so delivered.
	_, err := b.pool.Exec(context.Background(), "NOTIFY "+Channel)
	require.NoError(t, err)
}

func waitWake(t *testing.T, ch <-chan Wake) Wake {
	t.Helper()
	select {
	case w := <-ch:
		return w
	case <-time.After(waitTimeout):
		t.Fatalf("no wake-up within %s", waitTimeout)
		return Wake{}
	}
}

func requireNoWakePending(t *testing.T, ch <-chan Wake) {
	t.Helper()
	select {
	case w := <-ch:
		t.Fatalf("unexpected wake-up pending: %+v", w)
	default:
	}
}

// Guards against the listener not listening at all (wrong channel name, LISTEN run
// inside a transaction that never commits, notifications read but not forwarded): a
// committed NOTIFY must reach the worker as a "notify" wake-up at once, not at the
// next poll.
func TestListener_NotifyWakesQuickly(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{})
	b.start(t)

	sent := time.Now()
	b.notify(t)
	w := waitWake(t, b.l.Wakes())
	require.Equal(t, SourceNotify, w.Source)
	require.False(t, w.At.Before(sent), "At is when the notification arrived")
	require.Less(t, time.Since(sent), 2*time.Second, "a notification must wake the worker at once")
	require.Eventually(t, func() bool { return testutil.ToFloat64(b.l.m.notifications) == 1 },
		waitTimeout, 5*time.Millisecond)
}

// Guards against a Start that swallows a bad connection string and retries quietly
// in the background: a worker that can never reach its database must fail at
// start-up with a message, leave nothing running, and not print the password in
// that message.
func TestListener_StartFailsFast(t *testing.T) {
	t.Parallel()
	const password = "hunter2-never-logged"

	// A port that was free a moment ago: connection refused.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedPort := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())

	// A port whose connections are never answered, like a hung server or a
	// firewall that lets the handshake through: the kernel completes the TCP
	// handshake for the backlog, and nothing ever replies to the startup message.
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = mute.Close() })
	mutePort := mute.Addr().(*net.TCPAddr).Port

	tests := []struct {
		name string
		dsn  func(t *testing.T) string
		opts Options
	}{
		{
			name: "connection refused",
			dsn: func(*testing.T) string {
				return fmt.Sprintf("postgres://certworker:%s@127.0.0.1:%d/certworker?sslmode=disable", password, closedPort)
			},
		},
		{
			name: "server never answers, bounded by ConnectTimeout",
			dsn: func(*testing.T) string {
				return fmt.Sprintf("postgres://certworker:%s@127.0.0.1:%d/certworker?sslmode=disable", password, mutePort)
			},
			opts: Options{ConnectTimeout: 500 * time.Millisecond},
		},
		{
			name: "database does not exist",
			dsn: func(t *testing.T) string {
				return pgtest.Shared(t).URL("no_such_database")
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pool, err := pgxpool.New(context.Background(), tt.dsn(t)) // lazy: does not connect
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			b := setupWithPool(t, pool, "", tt.opts)

			began := time.Now()
			err = b.l.Start(context.Background())
			require.Error(t, err)
			require.Less(t, time.Since(began), 5*time.Second, "Start must fail fast")
			require.NotContains(t, err.Error(), password)
			for _, e := range b.logs.All() {
				require.NotContains(t, fmt.Sprint(e.Message, e.ContextMap()), password)
			}

			// Nothing left running, nothing emitted.
			b.l.mu.Lock()
			running := b.l.done != nil
			b.l.mu.Unlock()
			require.False(t, running, "a failed Start must not leave a goroutine behind")
			require.False(t, b.l.Connected())
			require.Equal(t, 0.0, testutil.ToFloat64(b.l.m.connected))
			requireNoWakePending(t, b.l.Wakes())
			b.l.Stop() // and Stop after a failed Start is a no-op
		})
	}
}

// A host that only timed out at Start (a busy server slow to answer within its
// host's connect_timeout, which a loaded machine has shown) is tried again within the
// attempt's bound, not taken for a dead one: here the first try reaches a port that
// accepts and never answers, with a 300 ms host bound, and the second the server.
// Start used to fail at the first try. A refusal still fails Start at once
// (TestListener_StartFailsFast).
func TestListener_StartTriesAgainAHostThatTimedOut(t *testing.T) {
	t.Parallel()
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = mute.Close() })
	mutePort := uint16(mute.Addr().(*net.TCPAddr).Port)

	_, dsn := pgtest.NewPool(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	var tries atomic.Int32
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		if tries.Add(1) == 1 {
			cc.Host, cc.Port, cc.ConnectTimeout = "127.0.0.1", mutePort, 300*time.Millisecond
			cc.Fallbacks = nil
		}
		return nil
	}
	_, b := setupWithConfig(t, cfg, dsn)
	b.start(t)
	require.EqualValues(t, 2, tries.Load(), "connect tries at Start")
	again := b.logs.FilterMessage("listener connect timed out; trying again within the attempt's bound").All()
	require.Len(t, again, 1)
	require.EqualValues(t, 1, again[0].ContextMap()["tries"])
	require.Contains(t, again[0].ContextMap()["error"], "timeout")
	b.notify(t)
	require.Equal(t, SourceNotify, waitWake(t, b.l.Wakes()).Source)
}

// Guards against one wake-up per notification: when a statement or a burst of
// transactions queues a thousand domains, the worker must run a pass or a handful,
// not a thousand passes, and the listener must never block on a busy worker. The
// worker here is busy for the whole burst (it reads nothing), which is the worst
// case: exactly one wake-up must be waiting afterwards.
func TestListener_CoalescesNotificationStorm(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{})
	b.start(t)

	const storm = 1000
	ctx := context.Background()
	conn, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	for range storm {
		// Each in its own transaction: PostgreSQL folds identical notifications
		// within one transaction, and the point is a thousand deliveries.
		_, err := conn.Exec(ctx, "SELECT pg_notify($1, '')", Channel)
		require.NoError(t, err)
	}
	conn.Release()

	// The listener has read them all once its counter says so.
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(b.l.m.notifications) == storm
	}, waitTimeout, 10*time.Millisecond, "every notification must be read off the connection")

	w := waitWake(t, b.l.Wakes())
	require.Equal(t, SourceNotify, w.Source)
	requireNoWakePending(t, b.l.Wakes())
	require.True(t, b.l.Connected(), "a storm must not cost the connection")
}

// Guards against a listener that dies with its connection: a terminated backend (as
// in a failover, a restart, or an administrator's pg_terminate_backend) must be
// noticed, reported as not ready, reconnected, followed by a catch-up pass, and
// notifications must flow on the new connection.
func TestListener_ReconnectsAfterBackendTerminated(t *testing.T) {
	t.Parallel()
	// A first delay of 0.5-1 s keeps the disconnected state visible long enough to
	// observe without a hook.
	b := setup(t, Options{BackoffMin: time.Second})
	b.start(t)
	ctx := context.Background()

	oldPID := b.l.backendPID.Load()
	require.NotZero(t, oldPID)
	var terminated bool
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", oldPID).Scan(&terminated))
	require.True(t, terminated)

	require.Eventually(t, func() bool { return !b.l.Connected() }, waitTimeout, 2*time.Millisecond,
		"a lost connection must make the listener not ready")
	require.Equal(t, 0.0, testutil.ToFloat64(b.l.m.connected))

	w := waitWake(t, b.l.Wakes())
	require.Equal(t, SourceReconnect, w.Source, "notifications were missed while away: the worker must catch up")
	require.True(t, b.l.Connected())
	require.Equal(t, 1.0, testutil.ToFloat64(b.l.m.connected))
	require.Equal(t, 1.0, testutil.ToFloat64(b.l.m.reconnects))
	require.NotEqual(t, oldPID, b.l.backendPID.Load(), "a new backend")

	lost := b.logs.FilterMessage("listener connection lost").All()
	require.Len(t, lost, 1)
	require.Equal(t, zapcore.WarnLevel, lost[0].Level)
	require.Contains(t, lost[0].ContextMap(), "error")
	require.Contains(t, lost[0].ContextMap(), "retry_in")
	require.Len(t, b.logs.FilterMessage("listener reconnected").All(), 1)

	b.notify(t)
	w = waitWake(t, b.l.Wakes())
	require.Equal(t, SourceNotify, w.Source, "the new connection must be listening")
}

// Guards against a listener that trusts a silent connection: one that died without
// a FIN (an expired NAT entry, a server that lost power) blocks its reads for ever,
// and a LISTEN-only client never writes, so it would wait for notifications that
// cannot come while /readyz says all is well. The proxy here swallows everything in
// both directions without closing anything, which is what such a connection looks
// like from the client.
func TestListener_DetectsHalfOpenConnection(t *testing.T) {
	t.Parallel()
	pool, dsn := pgtest.NewPool(t)
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" || strings.HasPrefix(u.Host, "/") {
		t.Skip("needs a TCP address in the test database URL")
	}
	proxy := newBlackholeProxy(t, u.Host)
	u.Host = proxy.addr()
	viaProxy, err := pgxpool.New(context.Background(), u.String())
	require.NoError(t, err)
	t.Cleanup(viaProxy.Close)

	b := setupWithPool(t, viaProxy, u.String(), Options{
		PingAfter:   200 * time.Millisecond,
		PingTimeout: 300 * time.Millisecond,
		BackoffMin:  10 * time.Millisecond,
	})
	b.pool = pool // notifications go straight to the server
	b.start(t)

	proxy.freeze()
	require.Equal(t, SourceReconnect, waitWake(t, b.l.Wakes()).Source)
	// Found by the listener's own check, not by a read that gave up on its own (the
	// reconnection's time is the host's: a stopwatch on it failed beside a CPU hog).
	// The first loss is the frozen connection's; a slow reply can end the new one too.
	lost := b.logs.FilterMessage("listener connection lost").All()
	require.NotEmpty(t, lost)
	require.Equal(t, "ping after 200ms of silence: timeout: context deadline exceeded", fmt.Sprint(lost[0].ContextMap()["error"]),
		"the dead connection was not found by the listener's own check (its ping's 300 ms deadline)")

	// The new connection is listening. Its checks are this test's: on a loaded
	// machine a healthy connection's reply can take longer than the 300 ms
	// PingTimeout, and the listener reconnects again (and wakes for that): then a
	// notification sent before the new LISTEN is lost, and the test sends another.
	for sent := 1; ; sent++ {
		b.notify(t)
		w := waitWake(t, b.l.Wakes())
		if w.Source == SourceNotify {
			break
		}
		require.Equal(t, SourceReconnect, w.Source, "the new connection must wake")
		require.Less(t, sent, 5, "the new connection never woke on a notification")
	}
}

// Guards against the silence check breaking a healthy connection: the wait for
// notifications is ended by a deadline every PingAfter, and the connection must
// survive that and the ping that follows, without a reconnection (which would
// trigger a needless catch-up pass each time).
func TestListener_PingOnSilenceKeepsHealthyConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{PingAfter: 50 * time.Millisecond})
	b.start(t)

	require.Eventually(t, func() bool {
		return b.logs.FilterMessage("ping").Len() >= 3
	}, waitTimeout, 10*time.Millisecond, "a silent connection must be checked")
	require.True(t, b.l.Connected())
	require.Equal(t, 0.0, testutil.ToFloat64(b.l.m.reconnects))
	requireNoWakePending(t, b.l.Wakes())

	b.notify(t)
	w := waitWake(t, b.l.Wakes())
	require.Equal(t, SourceNotify, w.Source)
}

// Guards against shutdown paths that hang, panic or leak: Stop before Start (the
// worker failed to start something else first), Stop twice and from two goroutines
// (a deferred Stop after an explicit one), and Stop must close the connection
// before it returns. Start on a running listener is refused, and a stopped one can
// be started again.
func TestListener_StopIsSafe(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{})
	ctx := context.Background()

	b.l.Stop()
	b.l.Stop()
	require.False(t, b.l.Connected())

	b.start(t)
	require.ErrorIs(t, b.l.Start(ctx), ErrStarted)
	pid := b.l.backendPID.Load()

	var wg sync.WaitGroup
	for range 2 {
		wg.Go(b.l.Stop)
	}
	wg.Wait()
	b.l.Stop()
	require.False(t, b.l.Connected())
	require.Equal(t, 0.0, testutil.ToFloat64(b.l.m.connected))
	require.Eventually(t, func() bool {
		var n int
		err := b.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n)
		return err == nil && n == 0
	}, waitTimeout, 10*time.Millisecond, "Stop must close the connection")

	b.start(t) // again, after Stop
	b.notify(t)
	require.Equal(t, SourceNotify, waitWake(t, b.l.Wakes()).Source)
	b.l.Stop()

	require.Zero(t, b.logs.FilterLevelExact(zapcore.WarnLevel).Len()+b.logs.FilterLevelExact(zapcore.ErrorLevel).Len(),
		"stopping is not a failure")
}

// Guards against a cancelled context being treated as a failure: at shutdown
// cmd/certworker cancels the context Start was given, and the listener must end
// without warnings or errors and without trying to reconnect.
func TestListener_ContextCancelStopsQuietly(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, b.l.Start(ctx))
	require.Equal(t, SourceReconnect, waitWake(t, b.l.Wakes()).Source)

	cancel()
	b.l.mu.Lock()
	done := b.l.done
	b.l.mu.Unlock()
	select {
	case <-done:
	case <-time.After(waitTimeout):
		t.Fatal("the listener did not end with its context")
	}
	require.False(t, b.l.Connected())
	require.Equal(t, 0.0, testutil.ToFloat64(b.l.m.reconnects))
	require.Zero(t, b.logs.FilterLevelExact(zapcore.WarnLevel).Len()+b.logs.FilterLevelExact(zapcore.ErrorLevel).Len(),
		"a cancelled context is not an error")
	require.Equal(t, 1, b.logs.FilterMessage("listener stopped").Len())
	b.l.Stop()
}

// Guards against the listener and the migration's trigger disagreeing (a channel
// renamed on one side only): a domain inserted into the claimable set wakes the
// worker through the real trigger. Which updates notify is the trigger's business
// and is tested with the migrations.
func TestListener_WakesOnClaimableDomainInsert(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{})
	b.start(t)
	ctx := context.Background()

	var tenantID string
	require.NoError(t, b.pool.QueryRow(ctx,
		"INSERT INTO proxy_tenants (name, slug, email) VALUES ('t', 't', 't@example.com') RETURNING id").Scan(&tenantID))
	_, err := b.pool.Exec(ctx, `INSERT INTO proxy_domains
		(tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
		VALUES ($1, 'a.example', 'verified', 'tok', 'pending', 'acme')`, tenantID)
	require.NoError(t, err)

	w := waitWake(t, b.l.Wakes())
	require.Equal(t, SourceNotify, w.Source)
}

// Guards against the merge losing the reason that matters: a reconnect arriving
// while a notify is pending must leave a reconnect pending (the worker then knows
// the pass is a catch-up), and nothing ever queues behind the pending one.
func TestMailbox_Merges(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	t1 := t0.Add(time.Second)
	tests := []struct {
		name    string
		pending *Wake
		send    Wake
		want    Wake
	}{
		{"empty takes notify", nil, Wake{SourceNotify, t1}, Wake{SourceNotify, t1}},
		{"empty takes reconnect", nil, Wake{SourceReconnect, t1}, Wake{SourceReconnect, t1}},
		{"notify absorbs notify", &Wake{SourceNotify, t0}, Wake{SourceNotify, t1}, Wake{SourceNotify, t0}},
		{"reconnect absorbs notify", &Wake{SourceReconnect, t0}, Wake{SourceNotify, t1}, Wake{SourceReconnect, t0}},
		{"reconnect upgrades notify, keeps earliest time", &Wake{SourceNotify, t0}, Wake{SourceReconnect, t1}, Wake{SourceReconnect, t0}},
		{"reconnect absorbs reconnect", &Wake{SourceReconnect, t0}, Wake{SourceReconnect, t1}, Wake{SourceReconnect, t0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := newMailbox()
			if tt.pending != nil {
				m.send(*tt.pending)
			}
			m.send(tt.send)
			require.Equal(t, tt.want, waitWake(t, m.ch))
			requireNoWakePending(t, m.ch)
		})
	}
}

// Guards against a backoff that hammers the server (no growth, or jitter that can
// reach zero) or one that waits too long (no cap, or an overflow after many
// failures turning the delay negative or huge).
func TestBackoff_GrowsJittersAndCaps(t *testing.T) {
	t.Parallel()
	l := &Listener{opts: Options{}.withDefaults()}
	for failures := range 100 {
		want := min(DefaultBackoffMin<<min(failures, 20), DefaultBackoffMax)
		for range 20 {
			d := l.backoff(failures)
			require.GreaterOrEqual(t, d, want/2, "failures=%d", failures)
			require.LessOrEqual(t, d, want, "failures=%d", failures)
		}
	}
}

// Guards against a listener that waits long before trying again after a long outage:
// however many tries have failed, the next one comes within a second (a failover is
// given 5 s, docs/high-availability.md, "Failover"), and never sooner than half of one
// (the jitter keeps a fleet out of lockstep).
func TestBackoff_StaysWithinASecondThroughALongOutage(t *testing.T) {
	t.Parallel()
	l := &Listener{opts: Options{}.withDefaults()}
	var waited time.Duration
	for failures := range 200 {
		d := l.backoff(failures)
		waited += d
		require.LessOrEqual(t, d, time.Second, "try %d, %s into the outage", failures+1, waited)
		if failures >= 4 { // 100 ms doubled four times reaches the cap
			require.GreaterOrEqual(t, d, 500*time.Millisecond, "try %d", failures+1)
		}
	}
}

// Guards against a multi-host URL whose first host does not answer (a dead primary
// listed first) taking the whole connection attempt: each host gets
// HostConnectTimeout, so the attempt reaches the second host, the new primary, well
// inside ConnectTimeout.
func TestListener_ConnectsToTheSecondHostWhenTheFirstDoesNotAnswer(t *testing.T) {
	t.Parallel()
	_, dsn := pgtest.NewPool(t)
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	dead := netrelay.Start(t, u.Host) // accepts, then answers nothing: a host that vanished
	dead.Blackhole()
	u.Host = dead.Addr() + "," + u.Host
	u.RawQuery = "sslmode=disable&target_session_attrs=read-write"
	pool, err := queue.NewPool(context.Background(), u.String())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := setupWithPool(t, pool, u.String(), Options{})
	b.start(t)
	b.notify(t)
	require.Equal(t, SourceNotify, waitWake(t, b.l.Wakes()).Source)
}

// Guards against an Options field left at zero reaching the loop: a zero PingAfter
// would ping in a tight loop, a zero backoff would reconnect in one.
func TestOptions_Defaults(t *testing.T) {
	t.Parallel()
	o := Options{}.withDefaults()
	require.Equal(t, DefaultPingAfter, o.PingAfter)
	require.Equal(t, DefaultPingTimeout, o.PingTimeout)
	require.Equal(t, DefaultConnectTimeout, o.ConnectTimeout)
	require.Equal(t, DefaultHostConnectTimeout, o.HostConnectTimeout)
	require.Equal(t, DefaultBackoffMin, o.BackoffMin)
	require.Equal(t, DefaultBackoffMax, o.BackoffMax)
	require.LessOrEqual(t, o.PingAfter+o.PingTimeout, 30*time.Second,
		"a half-open connection must be found within 30 s")

	o = Options{BackoffMin: time.Minute, BackoffMax: time.Second}.withDefaults()
	require.Equal(t, time.Minute, o.BackoffMax, "the cap is never below the start")
}

// blackholeProxy forwards TCP connections to upstream until freeze, after which the
// connections open at that moment silently swallow everything in both directions
// and never close: a half-open connection as the client sees it. Connections opened
// after freeze are forwarded normally.
type blackholeProxy struct {
	ln       net.Listener
	upstream string
	mu       sync.Mutex
	pairs    []*proxyPair
	wg       sync.WaitGroup
}

type proxyPair struct {
	client, server net.Conn
	frozen         bool // guarded by blackholeProxy.mu
}

func newBlackholeProxy(t *testing.T, upstream string) *blackholeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &blackholeProxy{ln: ln, upstream: upstream}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, pair := range p.pairs {
			_ = pair.client.Close()
			_ = pair.server.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *blackholeProxy) addr() string { return p.ln.Addr().String() }

func (p *blackholeProxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = client.Close()
			continue
		}
		pair := &proxyPair{client: client, server: server}
		p.mu.Lock()
		p.pairs = append(p.pairs, pair)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(pair, server, client) })
		p.wg.Go(func() { p.pipe(pair, client, server) })
	}
}

func (p *blackholeProxy) pipe(pair *proxyPair, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		frozen := pair.frozen
		p.mu.Unlock()
		if err != nil {
			if !frozen {
				// Pass the close on. A frozen pair passes nothing, not even that.
				_ = dst.Close()
			}
			return
		}
		if frozen {
			continue
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			_ = src.Close()
			return
		}
	}
}

func (p *blackholeProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pair := range p.pairs {
		pair.frozen = true
	}
}

// The listener sets up its session with the pool's AfterConnect, its bounds
// included, but not the pool sessions' warm-up: it never runs the wake path's
// statements, and on a busy server the warm-up kept its connect from finishing
// within ConnectTimeout (a worker's start failed on "listener: connect: timeout").
func TestListener_ItsSessionIsNotWarmedUpForThePool(t *testing.T) {
	t.Parallel()
	_, dsn := pgtest.NewPool(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	var warmed, set atomic.Int32
	queue.ConfigureSession(cfg, queue.Session{StatementTimeout: 7 * time.Second,
		Warm: func(context.Context, *pgx.Conn) error { warmed.Add(1); return nil }})
	prev := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		set.Add(1)
		return prev(ctx, conn)
	}
	pool, b := setupWithConfig(t, cfg, dsn)
	b.start(t)
	require.EqualValues(t, 1, set.Load(), "the listener's session was set up with the pool's AfterConnect")
	require.Zero(t, warmed.Load(), "the listener's session was warmed up")

	// The pool's own sessions still are.
	var timeout string
	require.NoError(t, pool.QueryRow(context.Background(), `SHOW statement_timeout`).Scan(&timeout))
	require.Equal(t, "7s", timeout)
	require.EqualValues(t, 1, warmed.Load(), "a pool session was not warmed up")
}
