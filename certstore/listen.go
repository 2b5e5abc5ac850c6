package certstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// stableAfter is how long a connection must have lasted for its loss to restart the
// backoff from BackoffMin; a server that accepts connections and drops them at once
// is otherwise retried ten times a second for ever.
const stableAfter = time.Minute

// recheckBatch is how many names one query of a reconnection's re-check covers: the
// array parameter stays well under a megabyte, and the query under a few ms.
const recheckBatch = 1000

// connect opens the store's own connection with the pool's configuration (its
// BeforeConnect and AfterConnect hooks included, so rotating credentials and session
// setup apply) and runs LISTEN on it. A connection of its own, not one of the pool's:
// a reconnection must not queue behind handshakes holding every pooled connection.
func (s *Store) connect(ctx context.Context) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.LoadTimeout+s.opts.PingTimeout)
	defer cancel()
	cfg := s.pool.Config()
	if cfg.BeforeConnect != nil {
		if err := cfg.BeforeConnect(ctx, cfg.ConnConfig); err != nil {
			return nil, fmt.Errorf("before connect: %w", err)
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if cfg.AfterConnect != nil {
		err = cfg.AfterConnect(ctx, conn)
	}
	if err == nil {
		_, err = conn.Exec(ctx, "LISTEN "+Channel)
	}
	if err != nil {
		s.closeConn(conn)
		return nil, fmt.Errorf("listen on %s: %w", Channel, err)
	}
	return conn, nil
}

// keepListening serves conn, and after every loss reconnects with backoff and
// re-checks what the cache holds, until ctx ends.
func (s *Store) keepListening(ctx context.Context, conn *pgx.Conn) {
	defer s.wg.Done()
	failures := 0
	for {
		upAt := time.Now()
		err := s.listen(ctx, conn)
		lostAt := time.Now()
		s.connected.Store(false)
		s.closeConn(conn)
		if ctx.Err() != nil {
			return
		}
		if lostAt.Sub(upAt) >= stableAfter {
			failures = 0
		}
		delay := s.backoff(failures)
		s.log.Warn("listener connection lost; serving from memory", zap.Error(err), zap.Duration("retry_in", delay))
		for conn = nil; conn == nil; {
			failures++
			if !sleep(ctx, delay) {
				return
			}
			if conn, err = s.connect(ctx); err != nil {
				delay = s.backoff(failures)
				s.log.Warn("listener reconnection failed", zap.Error(err),
					zap.Int("attempt", failures), zap.Duration("retry_in", delay))
			}
		}
		s.connected.Store(true)
		s.log.Info("listener reconnected", zap.Duration("down_for", time.Since(lostAt)))
		s.recheck(ctx)
	}
}

// listen hands every notification on conn to the cache until the connection fails
// or ctx ends, checking the connection after PingAfter of silence.
func (s *Store) listen(ctx context.Context, conn *pgx.Conn) error {
	for {
		waitCtx, cancel := context.WithTimeout(ctx, s.opts.PingAfter)
		n, err := conn.WaitForNotification(waitCtx)
		silent := waitCtx.Err() != nil && ctx.Err() == nil
		cancel()
		if n != nil && n.Channel == Channel {
			s.changed(n.Payload)
		}
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return ctx.Err()
		case silent:
			pctx, cancel := context.WithTimeout(ctx, s.opts.PingTimeout)
			_, err = conn.Exec(pctx, "SELECT 1")
			cancel()
			if err != nil {
				return fmt.Errorf("ping after %s of silence: %w", s.opts.PingAfter, err)
			}
		default:
			return fmt.Errorf("wait for notification: %w", err)
		}
	}
}

// changed handles a notification: the name's certificate row (or domain row)
// changed, so what is held for it is outdated and is loaded again in the
// background, the next handshake joining that load. The load must be a new one:
// one already under way may have read the row before the change.
func (s *Store) changed(name string) {
	names := []string{name}
	if base, ok := strings.CutPrefix(name, "*."); ok {
		// A wildcard's certificate is held under the names it serves.
		names = s.servedBy(base)
	}
	for _, name := range names {
		held := s.notify(name)
		s.log.Debug("certificate changed", zap.String("domain", name), zap.Bool("cached", held))
		if held {
			s.loads.Forget(name)
			s.refreshSoon(name)
		}
	}
}

// recheck follows a reconnection, when notifications may have been missed: misses
// are marked outdated, and every cached certificate whose row's version or domain
// moved is marked and reloaded. When the check itself fails, everything is marked,
// so each name is reloaded on its next handshake (and served as it is while the
// database does not answer).
func (s *Store) recheck(ctx context.Context) {
	certs, others := s.snapshot()
	s.outdate(others)
	names := make([]string, 0, len(certs))
	for name := range certs {
		names = append(names, name)
	}
	var moved []string
	for len(names) > 0 {
		batch := names[:min(recheckBatch, len(names))]
		names = names[len(batch):]
		versions, domains := make([]int64, len(batch)), make([]string, len(batch))
		for i, name := range batch {
			versions[i], domains[i] = certs[name].version, certs[name].domain
		}
		m, err := s.moved(ctx, batch, versions, domains)
		if err != nil {
			s.log.Warn("re-check after reconnection failed; every cached name is reloaded on its next handshake", zap.Error(err))
			s.outdateAll()
			return
		}
		moved = append(moved, m...)
	}
	for _, name := range s.outdate(moved) {
		s.loads.Forget(name)
		s.refreshSoon(name)
	}
	s.log.Info("re-checked cached certificates after reconnection",
		zap.Int("cached", len(certs)), zap.Int("changed", len(moved)))
}

// moved returns the names among names (held at versions, read from the certificate
// rows domains) for which certworker_certificate_for answers otherwise now: nothing
// to serve, or another certificate row, or another version of it.
func (s *Store) moved(ctx context.Context, names []string, versions []int64, domains []string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.LoadTimeout)
	defer cancel()
	rows, err := s.pool.Query(ctx, `
SELECT n.name
FROM unnest($1::text[], $2::bigint[], $3::text[]) AS n(name, version, domain)
LEFT JOIN LATERAL certworker_certificate_for(n.name) AS f ON true
WHERE f.domain IS DISTINCT FROM n.domain OR f.version IS DISTINCT FROM n.version`, names, versions, domains)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// backoff is the delay before reconnection attempt failures+1: BackoffMin doubled
// per failure, capped at BackoffMax, drawn at random from its upper half, so that
// proxies that lost the same server do not all come back at the same instant.
func (s *Store) backoff(failures int) time.Duration {
	d := s.opts.BackoffMin
	for i := 0; i < failures && d < s.opts.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, s.opts.BackoffMax)
	return d/2 + rand.N(d-d/2+1)
}

// closeConn closes conn within PingTimeout: the server should see a Terminate where
// it can, but a dead peer must not hold up Close.
func (s *Store) closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.PingTimeout)
	defer cancel()
	_ = conn.Close(ctx)
}

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
