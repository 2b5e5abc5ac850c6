package listener

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// session is the reconnection policy the NOTIFY listener and the logical waker share,
// around a connection of type C.
type session[C any] struct {
	log *zap.Logger
	// serve uses the connection until it fails (or ctx ends) and says why.
	serve func(ctx context.Context, c C) error
	// down closes a connection that failed and marks the source disconnected.
	down func(ctx context.Context, c C)
	// connect makes a new connection, ready to serve.
	connect func(ctx context.Context) (C, error)
	// up marks the source connected and sends the catch-up wake-up.
	up func(c C, reconnect bool, downFor time.Duration)
	// backoff is the delay before the attempt after the given number of failures.
	backoff func(failures int) time.Duration
}

// keepUp serves c and reconnects with backoff after every failure, until ctx ends. The
// backoff restarts from its minimum only after a connection lasted stableAfter.
func (s session[C]) keepUp(ctx context.Context, c C) {
	failures := 0 // consecutive, for the backoff
	for {
		upAt := time.Now()
		err := s.serve(ctx, c)
		lostAt := time.Now()
		s.down(ctx, c)
		if ctx.Err() != nil {
			s.log.Info("listener stopped")
			return
		}
		if time.Since(upAt) >= stableAfter {
			failures = 0
		}
		delay := s.backoff(failures)
		failures++
		s.log.Warn("listener connection lost", zap.Error(err), zap.Duration("retry_in", delay))

		for {
			if !sleep(ctx, delay) {
				s.log.Info("listener stopped")
				return
			}
			tried := time.Now()
			c, err = s.connect(ctx)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				s.log.Info("listener stopped")
				return
			}
			// The delay runs from the start of the failed try, which may have waited out a dead
			// host's connect timeout already.
			delay = max(s.backoff(failures)-time.Since(tried), 0)
			failures++
			s.log.Warn("listener reconnection failed",
				zap.Error(err), zap.Duration("retry_in", delay), zap.Int("attempt", failures))
		}
		s.up(c, true, time.Since(lostAt))
	}
}

// firstConnect is Start's connection attempt: one attempt, bounded by attempt (the
// ConnectTimeout), in which the hosts are tried again while they only timed out (a
// busy server slow to answer within its host's connect_timeout), so that a slow
// server does not fail the start as a dead one would. A host that refused, a failed
// login, a missing database or a setup error ends the attempt at once with its
// reason, as does the attempt's own bound. Later attempts are keepUp's.
func firstConnect[C any](ctx context.Context, log *zap.Logger, attempt time.Duration, connect func(context.Context) (C, error)) (C, error) {
	ctx, cancel := context.WithTimeout(ctx, attempt)
	defer cancel()
	for tries := 1; ; tries++ {
		c, err := connect(ctx)
		if err == nil || !pgconn.Timeout(err) || ctx.Err() != nil {
			return c, err
		}
		deadline, _ := ctx.Deadline()
		log.Info("listener connect timed out; trying again within the attempt's bound",
			zap.Error(err), zap.Int("tries", tries), zap.Duration("left", time.Until(deadline).Round(time.Millisecond)))
	}
}
