package listener

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"
)

// stream reads s until the connection fails or ctx ends, and returns why. It confirms
// s.pos every PingAfter, which releases WAL; after PingAfter of silence it asks for a
// reply, and a stream silent PingTimeout later is dead.
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

// sendStatus confirms s.pos as written, flushed and applied, asking for a reply if
// ask. Its write has a deadline, so that a peer that stopped reading cannot hold it.
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
