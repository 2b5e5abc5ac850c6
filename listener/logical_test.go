package listener

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/queue/issuing"
)

// logicalSettings start a server the logical waker can stream from. The package's
// shared server keeps PostgreSQL's default wal_level (replica), which is what the
// NOTIFY tests and TestLogical_StartFailsOnReplicaServer want, so the logical tests
// start one of their own and share it between subtests. Twenty slots and WAL
// senders leave room for the subtests that run at once, two wakers each at most.
var logicalSettings = []string{"wal_level=logical", "max_replication_slots=20", "max_wal_senders=20"}

type logicalBundle struct {
	lg     *Logical
	pool   *pgxpool.Pool
	dsn    string
	logs   *observer.ObservedLogs
	tenant string
}

// setupLogical builds a Logical on a fresh database of srv, with its logs captured
// and its metrics on a registry of its own. It does not start it; Stop runs at
// cleanup.
func setupLogical(t *testing.T, srv *pgtest.Server, opts Options) *logicalBundle {
	t.Helper()
	dsn := srv.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return setupLogicalWithPool(t, pool, dsn, opts)
}

func setupLogicalWithPool(t *testing.T, pool *pgxpool.Pool, dsn string, opts Options) *logicalBundle {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(zapcore.NewTee(core, zaptest.NewLogger(t).Core()))
	opts.Registerer = nil
	lg := NewLogical(pool, log, opts)
	t.Cleanup(lg.Stop)
	return &logicalBundle{lg: lg, pool: pool, dsn: dsn, logs: logs}
}

// start starts the waker and consumes the wake-up every connection emits.
func (b *logicalBundle) start(t *testing.T) {
	t.Helper()
	require.NoError(t, b.lg.Start(context.Background()))
	require.True(t, b.lg.Connected())
	require.Equal(t, SourceReconnect, waitWake(t, b.lg.Wakes()).Source,
		"the first connection must ask for a catch-up pass")
}

func (b *logicalBundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

// domain inserts a domain with the given columns and returns its id. A claimable one
// (verified, pending, acme) is a change the waker must wake for.
func (b *logicalBundle) domain(t *testing.T, verification, status, provider string) string {
	t.Helper()
	ctx := context.Background()
	if b.tenant == "" {
		require.NoError(t, b.pool.QueryRow(ctx,
			"INSERT INTO proxy_tenants (name, slug, email) VALUES ('t', 't', 't@example.com') RETURNING id").Scan(&b.tenant))
	}
	var id string
	require.NoError(t, b.pool.QueryRow(ctx, `INSERT INTO proxy_domains
		(tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
		VALUES ($1, $2, $3, 'tok', $4, $5) RETURNING id::text`,
		b.tenant, "d-"+uuid.NewString()+".example", verification, status, provider).Scan(&id))
	return id
}

// slot is one row of pg_replication_slots for the bundle's database, with how much
// WAL it holds back.
type slot struct {
	Name      string
	Temporary bool
	ActivePID *int32
	Retained  int64 // bytes, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)
}

func (b *logicalBundle) slots(t *testing.T) []slot {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `
SELECT slot_name::text, temporary, active_pid,
       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint
FROM pg_replication_slots WHERE database = current_database() ORDER BY slot_name`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (slot, error) {
		var s slot
		err := r.Scan(&s.Name, &s.Temporary, &s.ActivePID, &s.Retained)
		return s, err
	})
	require.NoError(t, err)
	return out
}

func (b *logicalBundle) terminate(t *testing.T, pid uint32) {
	t.Helper()
	var ok bool
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT pg_terminate_backend($1)", pid).Scan(&ok))
	require.True(t, ok)
}

// The logical waker's behaviour, on one wal_level=logical server. Each subtest has
// a database of its own; slots are global to the server, so every slot query is
// limited to the subtest's database.
func TestLogical(t *testing.T) {
	t.Parallel()
	srv := pgtest.StartServer(t, logicalSettings...)

	// Guards against a waker that does not stream at all (a publication of the
	// wrong table, a decoder that misreads the tuple, a wake-up sent at the wrong
	// message): a committed insert of a claimable domain must wake the worker at
	// once, as a change-driven "notify" wake-up, not at the next poll.
	t.Run("ClaimableInsertWakesQuickly", func(t *testing.T) {
		t.Parallel()
		b := setupLogical(t, srv, Options{})
		b.start(t)

		sent := time.Now()
		b.domain(t, "verified", "pending", "acme")
		w := waitWake(t, b.lg.Wakes())
		require.Equal(t, SourceNotify, w.Source)
		require.False(t, w.At.Before(sent))
		require.Less(t, time.Since(sent), 2*time.Second, "a change must wake the worker at once")
		require.Eventually(t, func() bool { return testutil.ToFloat64(b.lg.m.notifications) == 1 },
			waitTimeout, 5*time.Millisecond)
	})

	// Guards against the reason this mode exists being undone by its own noise or
	// by a decoder that wakes for everything: changes that leave a row outside the
	// claimable set, and a rolled-back claimable insert, must not wake. Each runs
	// in its own transaction; a claimable insert after them is the marker: the
	// stream is in commit order, so once its wake-up is in, everything before it
	// has been decoded, and the counter says whether any of it woke.
	t.Run("NonClaimableChangesDoNotWake", func(t *testing.T) {
		t.Parallel()
		b := setupLogical(t, srv, Options{})
		unverified := b.domain(t, "pending", "pending", "acme")
		claimable := b.domain(t, "verified", "pending", "acme")
		doomed := b.domain(t, "verified", "pending", "acme")
		b.start(t)

		for _, change := range []func(){
			func() { b.domain(t, "pending", "pending", "acme") },    // unverified
			func() { b.domain(t, "verified", "pending", "manual") }, // not acme
			func() { b.domain(t, "verified", "active", "acme") },    // already issued
			func() { b.exec(t, `UPDATE proxy_domains SET verification_token = 'tok2' WHERE id = $1`, unverified) },
			func() { b.exec(t, `UPDATE proxy_domains SET verification_status = 'failed' WHERE id = $1`, unverified) },
			func() { b.exec(t, `UPDATE proxy_domains SET ssl_status = 'failed' WHERE id = $1`, claimable) }, // leaves the set
			func() { b.exec(t, `DELETE FROM proxy_domains WHERE id = $1`, doomed) },
		} {
			change()
		}
		tx, err := b.pool.Begin(context.Background())
		require.NoError(t, err)
		_, err = tx.Exec(context.Background(), `INSERT INTO proxy_domains
			(tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
			VALUES ($1, 'rolled-back.example', 'verified', 'tok', 'pending', 'acme')`, b.tenant)
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(context.Background()))

		b.domain(t, "verified", "pending", "acme") // the marker
		require.Equal(t, SourceNotify, waitWake(t, b.lg.Wakes()).Source)
		require.Eventually(t, func() bool { return testutil.ToFloat64(b.lg.m.notifications) >= 1 },
			waitTimeout, 5*time.Millisecond)
		require.Equal(t, 1.0, testutil.ToFloat64(b.lg.m.notifications),
			"only the marker's transaction may have woken the waker")
		requireNoWakePending(t, b.lg.Wakes())
	})

	// Guards against a worker that cannot tell whether its snapshot saw what woke it:
	// the waker hands over the id of each claimable commit it announced, in commit
	// order, once, and none of a commit that woke nothing.
	t.Run("AnnouncesEachClaimableCommitsTransaction", func(t *testing.T) {
		t.Parallel()
		b := setupLogical(t, srv, Options{})
		b.domain(t, "pending", "pending", "acme") // gives the bundle its tenant
		b.start(t)
		insert := func(verification string) uint32 {
			ctx := context.Background()
			tx, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx) //nolint:errcheck
			_, err = tx.Exec(ctx, `INSERT INTO proxy_domains
				(tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
				VALUES ($1, $2, $3, 'tok', 'pending', 'acme')`, b.tenant, "d-"+uuid.NewString()+".example", verification)
			require.NoError(t, err)
			var full uint64
			require.NoError(t, tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text::numeric`).Scan(&full))
			require.NoError(t, tx.Commit(ctx))
			return uint32(full)
		}
		first := insert("verified")
		insert("pending") // not claimable: no wake-up, no id
		second := insert("verified")
		require.Eventually(t, func() bool { return testutil.ToFloat64(b.lg.m.notifications) == 2 },
			waitTimeout, 5*time.Millisecond)
		require.Equal(t, []uint32{first, second}, b.lg.Announced())
		require.Empty(t, b.lg.Announced(), "each id is handed over once")
	})

	// Guards against one wake-up per change: a thousand transactions that each
	// queue a domain, while the worker is busy (it reads nothing here), must leave
	// exactly one wake-up waiting; and one statement that queues 500 domains counts
	// as one event, as NOTIFY's once-per-transaction does.
	t.Run("CoalescesAStorm", func(t *testing.T) {
		t.Parallel()
		b := setupLogical(t, srv, Options{})
		b.domain(t, "pending", "pending", "acme") // creates the tenant outside the count
		b.start(t)

		const storm = 1000
		ctx := context.Background()
		conn, err := b.pool.Acquire(ctx)
		require.NoError(t, err)
		for i := range storm {
			_, err := conn.Exec(ctx, `INSERT INTO proxy_domains
				(tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
				VALUES ($1, $2, 'verified', 'tok', 'pending', 'acme')`, b.tenant, fmt.Sprintf("storm%d.example", i))
			require.NoError(t, err)
		}
		conn.Release()
		require.Eventually(t, func() bool {
			return testutil.ToFloat64(b.lg.m.notifications) == storm
		}, waitTimeout, 10*time.Millisecond, "every transaction must be read off the stream")
		require.Equal(t, SourceNotify, waitWake(t, b.lg.Wakes()).Source)
		requireNoWakePending(t, b.lg.Wakes())

		b.exec(t, `INSERT INTO proxy_domains
			(tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
			SELECT $1, 'bulk' || g || '.example', 'pending', 'tok', 'pending', 'acme' FROM generate_series(1, 500) g`, b.tenant)
		b.exec(t, `UPDATE proxy_domains SET verification_status = 'verified' WHERE domain LIKE 'bulk%'`)
		require.Equal(t, SourceNotify, waitWake(t, b.lg.Wakes()).Source)
		// The counter follows the send: the marker makes sure it has been counted.
		b.domain(t, "verified", "pending", "acme")
		require.Equal(t, SourceNotify, waitWake(t, b.lg.Wakes()).Source)
		require.Eventually(t, func() bool {
			return testutil.ToFloat64(b.lg.m.notifications) == storm+2
		}, waitTimeout, 5*time.Millisecond, "one statement that queues 500 domains is one event")
		requireNoWakePending(t, b.lg.Wakes())
		require.True(t, b.lg.Connected(), "a storm must not cost the connection")
	})

	// Guards against a role without the REPLICATION attribute producing a
	// stack of driver errors, or a worker that starts and never wakes: Start must
	// fail with one line that names the attribute and the statement that grants it.
	t.Run("StartFailsWithoutReplicationPrivilege", func(t *testing.T) {
		t.Parallel()
		b := setupLogical(t, srv, Options{})
		role := "norepl_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
		b.exec(t, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD 'secret-pw'", role))
		t.Cleanup(func() {
			if c, err := pgx.Connect(context.Background(), srv.AdminURL); err == nil {
				_, _ = c.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
				_ = c.Close(context.Background())
			}
		})
		u, err := url.Parse(b.dsn)
		require.NoError(t, err)
		u.User = url.UserPassword(role, "secret-pw")
		pool, err := pgxpool.New(context.Background(), u.String())
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		nb := setupLogicalWithPool(t, pool, u.String(), Options{})

		err = nb.lg.Start(context.Background())
		var se *SetupError
		require.ErrorAs(t, err, &se)
		t.Logf("Start: %v", err)
		require.Contains(t, err.Error(), "--wake logical: ")
		require.Contains(t, err.Error(), "ALTER ROLE "+`"`+role+`"`+" REPLICATION")
		require.NotContains(t, err.Error(), "\n")
		require.NotContains(t, err.Error(), "secret-pw")
		require.False(t, nb.lg.Connected())
		requireNoWakePending(t, nb.lg.Wakes())
	})

	// Guards against a database migrated by a role that could not create the
	// publication (the migration warns and goes on): Start must say what to run.
	t.Run("StartFailsWithoutPublication", func(t *testing.T) {
		t.Parallel()
		b := setupLogical(t, srv, Options{})
		b.exec(t, "DROP PUBLICATION "+Publication)
		err := b.lg.Start(context.Background())
		var se *SetupError
		require.ErrorAs(t, err, &se)
		t.Logf("Start: %v", err)
		require.Contains(t, err.Error(), "certworker migrate")
		require.Contains(t, err.Error(), "CREATE PUBLICATION "+Publication)
		require.Empty(t, b.slots(t), "a failed Start must leave no slot behind")
	})

	// Guards against a waker that dies with its connection (a failover, a restart,
	// an administrator's pg_terminate_backend of the WAL sender): it must be
	// noticed, reported as not ready, reconnected on a new slot, followed by a
	// catch-up pass, and changes must wake through the new stream.
	t.Run("ReconnectsAfterWALSenderTerminated", func(t *testing.T) {
		t.Parallel()
		b := setupLogical(t, srv, Options{BackoffMin: time.Second})
		b.start(t)
		before := b.slots(t)
		require.Len(t, before, 1)
		oldPID := b.lg.backendPID.Load()
		require.EqualValues(t, oldPID, *before[0].ActivePID, "the slot is streamed by the waker's WAL sender")

		b.terminate(t, oldPID)
		require.Eventually(t, func() bool { return !b.lg.Connected() }, waitTimeout, 2*time.Millisecond,
			"a lost stream must make the waker not ready")
		require.Equal(t, 0.0, testutil.ToFloat64(b.lg.m.connected))

		w := waitWake(t, b.lg.Wakes())
		require.Equal(t, SourceReconnect, w.Source, "changes were missed while away: the worker must catch up")
		require.True(t, b.lg.Connected())
		require.Equal(t, 1.0, testutil.ToFloat64(b.lg.m.reconnects))
		require.NotEqual(t, oldPID, b.lg.backendPID.Load())
		after := b.slots(t)
		require.Len(t, after, 1, "the old slot went with its session")
		require.NotEqual(t, before[0].Name, after[0].Name)

		lost := b.logs.FilterMessage("listener connection lost").All()
		require.Len(t, lost, 1)
		require.Equal(t, zapcore.WarnLevel, lost[0].Level)
		require.Contains(t, lost[0].ContextMap(), "retry_in")
		require.Equal(t, issuing.WakeLogical, lost[0].ContextMap()["mode"])
		require.Len(t, b.logs.FilterMessage("listener reconnected").All(), 1)

		b.domain(t, "verified", "pending", "acme")
		require.Equal(t, SourceNotify, waitWake(t, b.lg.Wakes()).Source, "the new stream must wake")
	})

	// Guards against a slot that makes the server keep WAL for a worker that is gone.
	// The waker's slot is temporary: when its WAL sender is terminated (as when the
	// worker crashes or its connection is cut) or the waker stops, the slot is gone, and
	// WAL written afterwards is held for nobody. While connected, the waker confirms what
	// it has read, so the slot does not hold back what is already decoded either.
	t.Run("SlotRetainsNoWALOnceTheWakerIsGone", func(t *testing.T) {
		t.Parallel()
		// PingAfter is the status interval: the slot's position is confirmed every
		// 100 ms. A first backoff of 3-6 s leaves time to look at the server
		// between the termination and the reconnection.
		b := setupLogical(t, srv, Options{PingAfter: 100 * time.Millisecond, BackoffMin: 6 * time.Second})
		b.start(t)
		s := b.slots(t)
		require.Len(t, s, 1)
		require.True(t, s[0].Temporary, "the slot must be temporary")
		require.True(t, strings.HasPrefix(s[0].Name, slotPrefix))
		t.Logf("connected: %d slot(s), %s temporary=%t, retained %d bytes", len(s), s[0].Name, s[0].Temporary, s[0].Retained)

		// Some WAL while connected: 2,000 rows of about 1 kB each time.
		lsn := func() string {
			var l string
			require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&l))
			return l
		}
		walSince := func(from string) int64 {
			var n int64
			require.NoError(t, b.pool.QueryRow(context.Background(),
				`SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, from).Scan(&n))
			return n
		}
		write := func() {
			b.exec(t, `INSERT INTO proxy_domains
				(tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
				SELECT $1, 'wal-' || gen_random_uuid() || '.example', 'pending', repeat('x', 1000), 'pending', 'acme'
				FROM generate_series(1, 2000)`, b.tenant)
		}
		b.domain(t, "pending", "pending", "acme") // the tenant
		from := lsn()
		write()
		written := walSince(from)
		// The slot's restart point moves at the first record of running
		// transactions after a confirmation; a checkpoint writes one (the
		// background writer does every 15 s otherwise).
		// The record counts only once the waker has confirmed the WAL before it; on
		// a loaded machine the waker may still be decoding the 2,000 rows at the
		// first checkpoint, and the next record would come 15 s later. So the
		// checkpoint is written again until the slot lets go.
		require.Eventually(t, func() bool {
			b.exec(t, "CHECKPOINT")
			s := b.slots(t)
			return len(s) == 1 && s[0].Retained < 256<<10
		}, waitTimeout, 250*time.Millisecond, "a connected waker must let the server release what it has read")
		s = b.slots(t)
		t.Logf("connected, after writing %d bytes of WAL and a checkpoint: retained %d bytes", written, s[0].Retained)

		// The worker's connection is cut.
		gone := s[0].Name
		b.terminate(t, b.lg.backendPID.Load())
		require.Eventually(t, func() bool { return len(b.slots(t)) == 0 }, waitTimeout, 10*time.Millisecond,
			"the slot must go with its session")
		// The server drops the slot as the session ends, possibly before the waker reads
		// the cut; its backoff of 3-6 s rules out a reconnection by then.
		require.Eventually(t, func() bool { return !b.lg.Connected() }, 2*time.Second, 10*time.Millisecond,
			"the waker must see the cut and be in its backoff")
		from = lsn()
		write()
		write()
		// On a loaded machine the two writes can outlast the backoff: a slot there is
		// then the reconnected waker's, a new one in use.
		s = b.slots(t)
		for _, sl := range s {
			require.NotEqual(t, gone, sl.Name, "nothing may hold WAL for a waker that is gone")
			require.NotNil(t, sl.ActivePID, "slot %s is held by no session", sl.Name)
		}
		t.Logf("WAL sender terminated, %d bytes of WAL written since: %d slot(s) in pg_replication_slots for this database, none of them the cut session's",
			walSince(from), len(s))

		// And a clean stop: the slot the reconnection made is dropped too.
		require.Equal(t, SourceReconnect, waitWake(t, b.lg.Wakes()).Source)
		require.Len(t, b.slots(t), 1)
		b.lg.Stop()
		// At once, not eventually: Stop returns only once the slot is gone (waitSlotGone).
		require.Empty(t, b.slots(t), "Stop returned while its slot was still on the server")
		from = lsn()
		write()
		t.Logf("waker stopped, %d bytes of WAL written since: %d slot(s)", walSince(from), len(b.slots(t)))
	})

	// Guards against a waker that trusts a silent stream: one that died without a
	// FIN blocks its reads for ever. The proxy swallows everything in both
	// directions without closing anything; the waker's request for a reply goes
	// unanswered, and it finds the connection dead by its own check (silent for
	// PingAfter, then no reply within PingTimeout) and reconnects. How long the
	// reconnection then takes is the server's: a new slot waits for the transactions
	// open on the server (beside a CPU hog, 4.5 s of other tests'), and says so.
	t.Run("DetectsHalfOpenConnection", func(t *testing.T) {
		t.Parallel()
		dsn := srv.NewDatabase(t)
		u, err := url.Parse(dsn)
		require.NoError(t, err)
		direct, err := pgxpool.New(context.Background(), dsn)
		require.NoError(t, err)
		t.Cleanup(direct.Close)
		proxy := newBlackholeProxy(t, u.Host)
		u.Host = proxy.addr()
		viaProxy, err := pgxpool.New(context.Background(), u.String())
		require.NoError(t, err)
		t.Cleanup(viaProxy.Close)
		b := setupLogicalWithPool(t, viaProxy, u.String(), Options{
			PingAfter:   200 * time.Millisecond,
			PingTimeout: 300 * time.Millisecond,
			BackoffMin:  10 * time.Millisecond,
		})
		b.start(t)
		b.pool = direct // changes go straight to the server

		proxy.freeze()
		require.Equal(t, SourceReconnect, waitWake(t, b.lg.Wakes()).Source)
		// The first loss is the frozen stream's; a slow reply can end the new one too.
		lost := b.logs.FilterMessage("listener connection lost").All()
		require.NotEmpty(t, lost)
		require.Equal(t, "ping after 200ms of silence: no reply within 300ms", fmt.Sprint(lost[0].ContextMap()["error"]),
			"the dead connection was not found by the waker's own check")

		// The new stream wakes on a change. Its checks are this test's: on a loaded
		// machine a healthy stream's reply can take longer than the 300 ms
		// PingTimeout, and the waker reconnects again (and wakes for that): then a
		// change made before the new slot existed is not on its stream, and the
		// test makes another.
		for changes := 1; ; changes++ {
			b.domain(t, "verified", "pending", "acme")
			w := waitWake(t, b.lg.Wakes())
			if w.Source == SourceNotify {
				break
			}
			require.Equal(t, SourceReconnect, w.Source, "the new stream must wake")
			require.Less(t, changes, 5, "the new stream never woke on a change")
		}
	})

	// Guards against the silence check or the status updates breaking a healthy
	// stream (a malformed update ends it; one that is never sent lets
	// wal_sender_timeout end it): the stream must survive many of both without a
	// reconnection, and still wake.
	t.Run("PingOnSilenceKeepsHealthyStream", func(t *testing.T) {
		t.Parallel()
		b := setupLogical(t, srv, Options{PingAfter: 50 * time.Millisecond})
		b.start(t)
		require.Eventually(t, func() bool {
			return b.logs.FilterMessage("ping").Len() >= 5
		}, waitTimeout, 10*time.Millisecond, "a silent stream must be checked")
		require.True(t, b.lg.Connected())
		require.Equal(t, 0.0, testutil.ToFloat64(b.lg.m.reconnects))
		requireNoWakePending(t, b.lg.Wakes())

		b.domain(t, "verified", "pending", "acme")
		require.Equal(t, SourceNotify, waitWake(t, b.lg.Wakes()).Source)
	})

	// Guards against shutdown paths that hang, panic or leak, as for the Listener:
	// Stop before Start, twice, from two goroutines; Stop closes the stream (and so
	// drops the slot) before it returns; a running waker refuses Start; a stopped
	// one starts again.
	t.Run("StopIsSafe", func(t *testing.T) {
		t.Parallel()
		b := setupLogical(t, srv, Options{})
		b.lg.Stop()
		b.lg.Stop()
		require.False(t, b.lg.Connected())

		b.start(t)
		require.ErrorIs(t, b.lg.Start(context.Background()), ErrStarted)
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(b.lg.Stop)
		}
		wg.Wait()
		require.False(t, b.lg.Connected())
		require.Equal(t, 0.0, testutil.ToFloat64(b.lg.m.connected))
		require.Empty(t, b.slots(t), "every Stop returned while the slot was still on the server")

		b.start(t)
		b.domain(t, "verified", "pending", "acme")
		require.Equal(t, SourceNotify, waitWake(t, b.lg.Wakes()).Source)
		b.lg.Stop()
		require.Zero(t, b.logs.FilterLevelExact(zapcore.WarnLevel).Len()+b.logs.FilterLevelExact(zapcore.ErrorLevel).Len(),
			"stopping is not a failure")
	})

	// Guards against several instances sharing one slot name (slots are global to
	// the server: the second would fail to start, or steal the first's stream):
	// two wakers on one database each stream from a slot of their own, and one
	// change wakes both.
	t.Run("InstancesHaveSlotsOfTheirOwn", func(t *testing.T) {
		t.Parallel()
		b := setupLogical(t, srv, Options{})
		other := setupLogicalWithPool(t, b.pool, b.dsn, Options{})
		b.start(t)
		other.start(t)
		s := b.slots(t)
		require.Len(t, s, 2)
		require.NotEqual(t, s[0].Name, s[1].Name)

		b.domain(t, "verified", "pending", "acme")
		require.Equal(t, SourceNotify, waitWake(t, b.lg.Wakes()).Source)
		require.Equal(t, SourceNotify, waitWake(t, other.lg.Wakes()).Source)
	})
}

// Guards against `--wake logical` on a server that cannot do it starting anyway and
// never waking, or failing with a driver error an operator has to decode: on the
// package's shared server, whose wal_level is PostgreSQL's default, Start must fail
// with one line that names the setting and how to change it, and leave nothing
// running and no slot.
func TestLogical_StartFailsOnReplicaServer(t *testing.T) {
	t.Parallel()
	pool, dsn := pgtest.NewPool(t)
	var level string
	require.NoError(t, pool.QueryRow(context.Background(), "SHOW wal_level").Scan(&level))
	if level == "logical" {
		t.Skip("the shared server runs with wal_level=logical")
	}
	b := setupLogicalWithPool(t, pool, dsn, Options{})

	err := b.lg.Start(context.Background())
	var se *SetupError
	require.ErrorAs(t, err, &se)
	require.Equal(t, fmt.Sprintf(`--wake logical: the server's wal_level is %q; set wal_level = logical in postgresql.conf and restart PostgreSQL`, level),
		err.Error())

	b.lg.mu.Lock()
	running := b.lg.done != nil
	b.lg.mu.Unlock()
	require.False(t, running, "a failed Start must not leave a goroutine behind")
	require.False(t, b.lg.Connected())
	requireNoWakePending(t, b.lg.Wakes())
	var slots int
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_replication_slots WHERE database = current_database()").Scan(&slots))
	require.Zero(t, slots)
	b.lg.Stop()
}
