package listener

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// The values of `certworker run --wake`, and of certworker_settings.wake.
const (
	// ModeNotify: the trigger notifies and a Listener listens. Works on any server.
	ModeNotify = "notify"
	// ModeLogical: the trigger does not notify and a Logical reads the changes from
	// a logical replication stream.
	ModeLogical = "logical"
)

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

// Waker is a source of wake-ups for the worker: Listener (NOTIFY) or Logical
// (logical replication). Every implementation MUST:
//   - connect in Start and return its error, leaving nothing running, so that a
//     worker that cannot be woken fails at start-up; then keep reconnecting until
//     Stop or the end of Start's context;
//   - send a SourceReconnect wake-up on every connection, once anything committed
//     from then on will wake it;
//   - never block on the consumer: Wakes has a buffer of one and merges;
//   - make Stop safe before Start, safe twice and from several goroutines, and
//     return only once nothing of it runs;
//   - be safe for concurrent use.
type Waker interface {
	// Start connects and backgrounds the waker.
	Start(ctx context.Context) error
	// Stop ends it and waits until it has ended.
	Stop()
	// Wakes is where wake-ups arrive. It is never closed.
	Wakes() <-chan Wake
	// Connected reports whether the waker holds a live connection that will see
	// the next change (/readyz).
	Connected() bool
}

var (
	_ Waker = (*Listener)(nil)
	_ Waker = (*Logical)(nil)
)

// SetupError says that the server cannot do what --wake logical needs, and which
// setting to change. Its message is one line, meant to be shown to the operator as
// it is.
type SetupError struct {
	msg string
}

func (e *SetupError) Error() string { return e.msg }

func setupErrorf(format string, args ...any) *SetupError {
	return &SetupError{msg: "--wake logical: " + fmt.Sprintf(format, args...)}
}

// SetMode records mode (ModeNotify or ModeLogical) in certworker_settings, which
// decides whether the wake trigger notifies, and returns the mode that was in force
// before (ModeNotify where none was recorded). `certworker run` calls it once its
// waker has started.
//
// It writes only when the mode changes, so that a worker in notify mode, the
// default, needs nothing on certworker_settings beyond the SELECT every role has;
// switching needs INSERT and UPDATE on it, which the role that migrated has.
//
// The setting is shared by every instance on the database: an instance still
// running in notify mode after another set logical hears no more notifications and
// wakes only on its timer and poll until it is restarted with --wake logical. A
// caller that sees the mode change should say so.
func SetMode(ctx context.Context, pool *pgxpool.Pool, mode string) (previous string, err error) {
	if mode != ModeNotify && mode != ModeLogical {
		return "", fmt.Errorf("set wake mode: %q is neither %s nor %s", mode, ModeNotify, ModeLogical)
	}
	current := ModeNotify
	err = pool.QueryRow(ctx, `SELECT wake FROM certworker_settings WHERE id`).Scan(&current)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("read wake mode: %w", err)
	}
	if current == mode {
		return current, nil
	}
	// The CTE reads the row as it was before the statement, so that an instance
	// switching at the same moment is reported too.
	var prev *string
	err = pool.QueryRow(ctx, `
WITH old AS (SELECT wake FROM certworker_settings WHERE id)
INSERT INTO certworker_settings (id, wake, updated_at) VALUES (true, $1, now())
ON CONFLICT (id) DO UPDATE SET wake = EXCLUDED.wake, updated_at = EXCLUDED.updated_at
RETURNING (SELECT wake FROM old)`, mode).Scan(&prev)
	if err != nil {
		return "", fmt.Errorf("record wake mode in certworker_settings (the worker's role needs INSERT and UPDATE on it to switch modes): %w", err)
	}
	if prev == nil {
		return ModeNotify, nil
	}
	return *prev, nil
}

// Logical turns the changes of a logical replication stream into Wakes: the second
// wake source of issue #5, chosen with `certworker run --wake logical`. Its methods
// are safe for concurrent use.
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
// REPLICATION attribute, a free replication slot and WAL sender per instance
// (max_replication_slots and max_wal_senders, 10 each by default), and the
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
		log:   log.Named("listener").With(zap.String("mode", ModeLogical)),
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

// relation is where a table's claimable-set columns are in its tuples; -1 for a
// column the table does not have, which counts as matching (see matches).
type relation struct {
	domains                        bool
	verification, provider, status int
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

// connect opens a replication connection, checks that the server can stream what
// the waker needs, creates a temporary slot and starts streaming from it. Once it
// returns, every transaction that commits will be in the stream; anything committed
// before is for the catch-up pass that up triggers.
//
// The connection is made with the pool's configuration and its BeforeConnect hook,
// as the Listener's is; the AfterConnect hook is not run, because it takes a
// *pgx.Conn, which a replication connection cannot be (a WAL sender speaks only
// the simple query protocol), and session setup does not concern a stream.
func (lg *Logical) connect(ctx context.Context) (_ *stream, err error) {
	ctx, cancel := context.WithTimeout(ctx, lg.opts.ConnectTimeout)
	defer cancel()
	cfg := lg.pool.Config() // a deep copy: ours to modify
	if cfg.BeforeConnect != nil {
		if err := cfg.BeforeConnect(ctx, cfg.ConnConfig); err != nil {
			return nil, fmt.Errorf("before connect: %w", err)
		}
	}
	pgcfg := cfg.ConnConfig.Config.Copy()
	if pgcfg.RuntimeParams == nil {
		pgcfg.RuntimeParams = map[string]string{}
	}
	// A logical WAL sender for the DSN's database, which also accepts SQL.
	pgcfg.RuntimeParams["replication"] = "database"
	if pgcfg.RuntimeParams["application_name"] == "" {
		pgcfg.RuntimeParams["application_name"] = "certworker-wake"
	}
	// The stream's reads end at deadlines of their own (the silence check), and a
	// deadline leaves the connection usable; a cancel request would not make sense
	// to a WAL sender. pgconn's default, made explicit.
	pgcfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	conn, err := pgconn.ConnectConfig(ctx, pgcfg)
	if err != nil {
		if se := connectSetupError(err, pgcfg.User); se != nil {
			return nil, se
		}
		// pgconn's errors name host, port, user and database, never the password.
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer func() {
		if err != nil {
			lg.closeConn(ctx, conn)
		}
	}()

	level, err := queryOne(ctx, conn, "SHOW wal_level")
	if err != nil {
		return nil, fmt.Errorf("read wal_level: %w", err)
	}
	if level != "logical" {
		return nil, setupErrorf("the server's wal_level is %q; set wal_level = logical in postgresql.conf and restart PostgreSQL", level)
	}
	published, err := queryOne(ctx, conn, fmt.Sprintf(
		"SELECT count(*) FROM pg_publication_tables WHERE pubname = '%s' AND tablename = '%s'", Publication, domainsTable))
	if err != nil {
		return nil, fmt.Errorf("look up publication %s: %w", Publication, err)
	}
	if published == "0" {
		return nil, setupErrorf("database %q has no publication %s of %s; run `certworker migrate` as the owner of %s, or CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert, update')",
			pgcfg.Database, Publication, domainsTable, domainsTable, Publication, domainsTable)
	}

	slot, err := newSlotName()
	if err != nil {
		return nil, err
	}
	created, err := pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{
		Temporary:      true,
		Mode:           pglogrepl.LogicalReplication,
		SnapshotAction: "NOEXPORT_SNAPSHOT",
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "53400" { // configuration_limit_exceeded
			return nil, setupErrorf("all replication slots are in use; raise max_replication_slots in postgresql.conf (each instance needs one) and restart PostgreSQL")
		}
		return nil, fmt.Errorf("create temporary replication slot: %w", err)
	}
	start, err := pglogrepl.ParseLSN(created.ConsistentPoint)
	if err != nil {
		return nil, fmt.Errorf("create temporary replication slot: consistent point: %w", err)
	}
	// Protocol version 1: a transaction arrives whole, at its commit. Version 2's
	// streaming would send large transactions while they run, and a wake-up for a
	// transaction that may still roll back would be one the claim cannot act on.
	err = pglogrepl.StartReplication(ctx, conn, slot, start, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", fmt.Sprintf("publication_names '%s'", Publication)},
	})
	if err != nil {
		return nil, fmt.Errorf("start replication: %w", err)
	}
	return &stream{conn: conn, slot: slot, pos: start, rels: map[uint32]relation{}}, nil
}

// connectSetupError recognises the connection errors that mean the server will not
// give this role a WAL sender, and says what to change; nil for any other.
func connectSetupError(err error, user string) *SetupError {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return nil
	}
	switch {
	case pgErr.Code == "42501": // insufficient_privilege
		// PostgreSQL 15: "must be superuser or replication role to start
		// walsender"; 16: "permission denied to start WAL sender".
		return setupErrorf("role %q may not open a replication connection (%s); grant it with ALTER ROLE %s REPLICATION (on a managed service, its replication role, such as GRANT rds_replication TO %s)",
			user, pgErr.Message, quoteIdent(user), quoteIdent(user))
	case pgErr.Code == "53300" && strings.Contains(pgErr.Message, "max_wal_senders (currently 0)"):
		// wal_level = minimal requires max_wal_senders = 0.
		return setupErrorf("the server allows no WAL senders (max_wal_senders = 0); set wal_level = logical and max_wal_senders to at least one per instance in postgresql.conf, and restart PostgreSQL")
	case pgErr.Code == "53300" && strings.Contains(pgErr.Message, "max_wal_senders"):
		return setupErrorf("the server has no free WAL sender (%s); raise max_wal_senders in postgresql.conf (each instance needs one) and restart PostgreSQL", pgErr.Message)
	}
	return nil
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// queryOne runs a simple query that returns one value, on a connection that speaks
// only the simple query protocol.
func queryOne(ctx context.Context, conn *pgconn.PgConn, sql string) (string, error) {
	results, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return "", err
	}
	if len(results) != 1 || len(results[0].Rows) != 1 || len(results[0].Rows[0]) != 1 {
		return "", fmt.Errorf("%s: expected one value", sql)
	}
	return string(results[0].Rows[0][0]), nil
}

func newSlotName() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("slot name: %w", err)
	}
	return slotPrefix + hex.EncodeToString(b[:]), nil
}

// stream reads s until the connection fails or ctx ends, and returns why it
// stopped.
//
// It sends the server a status update confirming s.pos at least every PingAfter,
// which lets the server release the WAL before it and answers wal_sender_timeout.
// When nothing at all has arrived for PingAfter, the update asks for a reply, and a
// stream still silent PingTimeout later is dead: a connection lost without a FIN
// would otherwise be read from for ever, as the Listener's would.
func (lg *Logical) stream(ctx context.Context, s *stream) error {
	lastHeard := time.Now()
	nextStatus := lastHeard.Add(lg.opts.PingAfter)
	var replyBy time.Time // zero unless a reply is awaited
	for {
		now := time.Now()
		switch {
		case replyBy.IsZero() && !now.Before(lastHeard.Add(lg.opts.PingAfter)):
			if err := lg.sendStatus(s, true); err != nil {
				return err
			}
			replyBy = now.Add(lg.opts.PingTimeout)
			nextStatus = now.Add(lg.opts.PingAfter)
		case !now.Before(nextStatus):
			if err := lg.sendStatus(s, false); err != nil {
				return err
			}
			nextStatus = now.Add(lg.opts.PingAfter)
		}
		deadline := nextStatus
		if replyBy.IsZero() {
			deadline = minTime(deadline, lastHeard.Add(lg.opts.PingAfter))
		} else {
			deadline = minTime(deadline, replyBy)
		}
		rctx, cancel := context.WithDeadline(ctx, deadline)
		msg, err := s.conn.ReceiveMessage(rctx)
		cancel()
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return ctx.Err()
		case pgconn.Timeout(err):
			if !replyBy.IsZero() && !time.Now().Before(replyBy) {
				return fmt.Errorf("ping after %s of silence: no reply within %s", lg.opts.PingAfter, lg.opts.PingTimeout)
			}
			continue
		default:
			return fmt.Errorf("receive: %w", err)
		}
		lastHeard, replyBy = time.Now(), time.Time{}

		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			reply, err := lg.handle(s, msg.Data)
			if err != nil {
				return err
			}
			if reply {
				if err := lg.sendStatus(s, false); err != nil {
					return err
				}
				nextStatus = time.Now().Add(lg.opts.PingAfter)
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return errors.New("replication stream: the server ended it")
		default:
			// Notices and parameter changes say nothing about proxy_domains.
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// handle acts on one CopyData message of the stream, and reports whether the
// server asked for an immediate status update.
func (lg *Logical) handle(s *stream, data []byte) (reply bool, err error) {
	if len(data) == 0 {
		return false, errors.New("replication stream: empty message")
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return false, fmt.Errorf("replication stream: %w", err)
		}
		// A logical WAL sender's keepalive carries the position it has sent
		// everything up to, so there is nothing before it left to receive.
		s.pos = max(s.pos, k.ServerWALEnd)
		return k.ReplyRequested, nil
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return false, fmt.Errorf("replication stream: %w", err)
		}
		return false, lg.decode(s, x.WALData)
	}
	return false, nil
}

// decode acts on one pgoutput message: a wake-up at the commit of a transaction
// that wrote a claimable row.
func (lg *Logical) decode(s *stream, data []byte) error {
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return fmt.Errorf("replication stream: decode: %w", err)
	}
	switch msg := msg.(type) {
	case *pglogrepl.RelationMessage:
		// Sent before a table's first change in the stream and again whenever its
		// definition changed, so the column positions follow ALTER TABLE.
		r := relation{domains: msg.RelationName == domainsTable, verification: -1, provider: -1, status: -1}
		for i, c := range msg.Columns {
			switch c.Name {
			case "verification_status":
				r.verification = i
			case "ssl_provider":
				r.provider = i
			case "ssl_status":
				r.status = i
			}
		}
		s.rels[msg.RelationID] = r
	case *pglogrepl.BeginMessage:
		s.claimable = false
	case *pglogrepl.InsertMessage:
		s.claimable = s.claimable || s.matches(msg.RelationID, msg.Tuple)
	case *pglogrepl.UpdateMessage:
		s.claimable = s.claimable || s.matches(msg.RelationID, msg.NewTuple)
	case *pglogrepl.CommitMessage:
		s.pos = max(s.pos, msg.TransactionEndLSN)
		if s.claimable {
			s.claimable = false
			lg.wakes.send(Wake{Source: SourceNotify, At: time.Now()})
			// Counted after the send, as the Listener counts its notifications.
			lg.m.notifications.Inc()
			lg.log.Debug("claimable change", zap.Stringer("commit_lsn", msg.CommitLSN))
		}
	}
	return nil
}

// matches reports whether tuple, a new row of the relation rel, is in the claimable
// set: verified, acme, pending. Where it cannot tell (a column it was not sent, or a
// table it was not described) it answers yes: a spurious wake-up costs a pass, a
// missed one costs a domain its certificate until the poll.
func (s *stream) matches(rel uint32, tuple *pglogrepl.TupleData) bool {
	r, ok := s.rels[rel]
	if !ok {
		return true
	}
	if !r.domains {
		return false
	}
	if tuple == nil {
		return true
	}
	is := func(i int, want string) bool {
		if i < 0 || i >= len(tuple.Columns) {
			return true
		}
		c := tuple.Columns[i]
		switch c.DataType {
		case 'n': // NULL
			return false
		case 'u': // an unchanged TOASTed value, not sent; these columns never are
			return true
		default: // 't' text; 'b' binary, which for text is the same bytes
			return string(c.Data) == want
		}
	}
	return is(r.verification, "verified") && is(r.provider, "acme") && is(r.status, "pending")
}

// sendStatus confirms s.pos to the server as written, flushed and applied, and asks
// for an immediate reply if ask. Confirming a position lets the server release the
// WAL before it; the waker keeps nothing, so everything it has received is done.
// The write has a deadline: a peer that stopped reading must not hold the stream.
func (lg *Logical) sendStatus(s *stream, ask bool) error {
	nc := s.conn.Conn()
	_ = nc.SetWriteDeadline(time.Now().Add(lg.opts.PingTimeout))
	defer func() { _ = nc.SetWriteDeadline(time.Time{}) }()
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: s.pos,
		ReplyRequested:   ask,
	})
	if err != nil {
		return fmt.Errorf("send status update: %w", err)
	}
	if ask {
		lg.log.Debug("ping", zap.Duration("silent_for", lg.opts.PingAfter))
	}
	return nil
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
}

// closeConn closes conn within PingTimeout, also once ctx is cancelled, as
// Listener.close does.
func (lg *Logical) closeConn(ctx context.Context, conn *pgconn.PgConn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lg.opts.PingTimeout)
	defer cancel()
	_ = conn.Close(ctx)
}
