package listener

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"go.uber.org/zap"
)

// connect opens a replication connection, checks the server, creates a temporary slot
// and streams from it; anything committed before is for up's catch-up pass. It runs the
// pool's BeforeConnect hook but not AfterConnect, whose *pgx.Conn a WAL sender cannot be.
func (lg *Logical) connect(ctx context.Context) (_ *stream, err error) {
	ctx, cancel := context.WithTimeout(ctx, lg.opts.ConnectTimeout)
	defer cancel()
	pgcfg, err := lg.replicationConfig(ctx)
	if err != nil {
		return nil, err
	}
	conn, err := pgconn.ConnectConfig(ctx, pgcfg)
	if err != nil {
		if se := connectSetupError(err, pgcfg.User); se != nil {
			return nil, se
		}
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer func() {
		if err != nil {
			lg.closeConn(ctx, conn)
		}
	}()
	if err := checkPublishing(ctx, conn, pgcfg.Database); err != nil {
		return nil, err
	}
	return lg.startStream(ctx, conn)
}

// replicationConfig configures a logical WAL sender on the pool's database.
func (lg *Logical) replicationConfig(ctx context.Context) (*pgconn.Config, error) {
	var pgcfg *pgconn.Config
	if lg.opts.Replication != nil {
		pgcfg = lg.opts.Replication.Copy()
	} else {
		cfg := lg.pool.Config() // a deep copy: ours to modify
		if cfg.BeforeConnect != nil {
			if err := cfg.BeforeConnect(ctx, cfg.ConnConfig); err != nil {
				return nil, fmt.Errorf("before connect: %w", err)
			}
		}
		pgcfg = cfg.ConnConfig.Config.Copy()
	}
	lg.opts.boundHosts(pgcfg)
	if pgcfg.RuntimeParams == nil {
		pgcfg.RuntimeParams = map[string]string{}
	}
	// A logical WAL sender for the DSN's database, which also accepts SQL.
	pgcfg.RuntimeParams["replication"] = "database"
	if pgcfg.RuntimeParams["application_name"] == "" {
		pgcfg.RuntimeParams["application_name"] = "certworker-wake"
	}
	// Reads end at their own deadlines, which leave the connection usable.
	pgcfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	return pgcfg, nil
}

// checkPublishing checks that the server decodes WAL logically and that database
// publishes the domains table, and says what to change when not.
func checkPublishing(ctx context.Context, conn *pgconn.PgConn, database string) error {
	level, err := queryOne(ctx, conn, "SHOW wal_level")
	if err != nil {
		return fmt.Errorf("read wal_level: %w", err)
	}
	if level != "logical" {
		return setupErrorf("the server's wal_level is %q; set wal_level = logical in postgresql.conf and restart PostgreSQL", level)
	}
	published, err := queryOne(ctx, conn, fmt.Sprintf(
		"SELECT count(*) FROM pg_publication_tables WHERE pubname = '%s' AND tablename = '%s'", Publication, domainsTable))
	if err != nil {
		return fmt.Errorf("look up publication %s: %w", Publication, err)
	}
	if published == "0" {
		return setupErrorf("database %q has no publication %s of %s; run `certworker migrate` as the owner of %s, or CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert, update')",
			database, Publication, domainsTable, domainsTable, Publication, domainsTable)
	}
	return nil
}

// slotWaitLogged is how long creating the slot may take before it is logged.
const slotWaitLogged = time.Second

// startStream creates a temporary slot on conn and streams from it. Creating the slot
// waits for the transactions that had written something to end, so a long wait is logged.
func (lg *Logical) startStream(ctx context.Context, conn *pgconn.PgConn) (*stream, error) {
	slot, err := newSlotName()
	if err != nil {
		return nil, err
	}
	asked := time.Now()
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
		if ctx.Err() != nil {
			return nil, fmt.Errorf("create temporary replication slot: still waiting after %s for the transactions open on the server when it was asked for to end: %w",
				time.Since(asked).Round(time.Millisecond), err)
		}
		return nil, fmt.Errorf("create temporary replication slot: %w", err)
	}
	if waited := time.Since(asked); waited >= slotWaitLogged {
		lg.log.Info("temporary replication slot created once the transactions open on the server when it was asked for had ended (after a failover, those open at the promotion)",
			zap.String("slot", slot), zap.Duration("waited", waited))
	}
	start, err := pglogrepl.ParseLSN(created.ConsistentPoint)
	if err != nil {
		return nil, fmt.Errorf("create temporary replication slot: consistent point: %w", err)
	}
	// Protocol version 1: a transaction arrives whole, at its commit.
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

// queryOne runs a one-value query over the simple query protocol.
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
