package worker_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/certworker/certworker/queue"
)

// faultDB runs the worker's statements on a real pool, and fails chosen ones in
// chosen ways: PostgreSQL stays real, only what reaches the worker is not.
type faultDB struct {
	*pgxpool.Pool
	mu sync.Mutex
	// lose: statements containing this text run and commit, then their answer is
	// replaced by an error, as when the connection drops after the commit; times is
	// how many more to lose.
	lose      string
	loseTimes int
	// hang: statements containing any of these texts wait until their context ends
	// (a database that stopped answering them), and fail without running.
	hang []string
	// counts: how many statements containing each watched text were sent.
	counts map[string]int
	// slow: the next Exec containing this text runs, then its answer is held for
	// slowFor (a reply that arrives late), once.
	slow    string
	slowFor time.Duration
}

// slowNext makes the next Exec containing text answer d after it ran, or the next
// QueryRow answer d later.
func (f *faultDB) slowNext(text string, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.slow, f.slowFor = text, d
}

// takeSlow is how long to hold the answer of sql (0: not at all).
func (f *faultDB) takeSlow(sql string) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.slow == "" || !strings.Contains(sql, f.slow) {
		return 0
	}
	f.slow = ""
	return f.slowFor
}

var _ queue.DB = (*faultDB)(nil)

var errConnectionLost = errors.New("injected: connection lost after the statement committed")

// loseNext makes the next n statements containing text lose their answer.
func (f *faultDB) loseNext(text string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lose, f.loseTimes = text, n
}

func (f *faultDB) hangOn(texts ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hang = texts
}

// watch starts counting the statements that contain text.
func (f *faultDB) watch(text string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.counts == nil {
		f.counts = map[string]int{}
	}
	f.counts[text] = 0
}

// count is how many statements containing a watched text were sent.
func (f *faultDB) count(text string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts[text]
}

// fault decides what happens to sql: lost (run, then fail) or hung (wait, then fail).
func (f *faultDB) fault(sql string) (lost, hung bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for text := range f.counts {
		if strings.Contains(sql, text) {
			f.counts[text]++
		}
	}
	if f.loseTimes > 0 && strings.Contains(sql, f.lose) {
		f.loseTimes--
		return true, false
	}
	for _, h := range f.hang {
		if strings.Contains(sql, h) {
			return false, true
		}
	}
	return false, false
}

func (f *faultDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	lost, hung := f.fault(sql)
	switch {
	case hung:
		<-ctx.Done()
		return nil, ctx.Err()
	case lost:
		rows, err := f.Pool.Query(ctx, sql, args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
		}
		rows.Close()
		return nil, errConnectionLost
	}
	return f.Pool.Query(ctx, sql, args...)
}

func (f *faultDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if _, hung := f.fault(sql); hung {
		<-ctx.Done()
		return errRow{ctx.Err()}
	}
	if d := f.takeSlow(sql); d > 0 {
		// A query's answer is its row: held before it is read, within ctx.
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return errRow{ctx.Err()}
		}
	}
	return f.Pool.QueryRow(ctx, sql, args...)
}

func (f *faultDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if _, hung := f.fault(sql); hung {
		<-ctx.Done()
		return pgconn.CommandTag{}, ctx.Err()
	}
	d := f.takeSlow(sql)
	tag, err := f.Pool.Exec(ctx, sql, args...)
	if d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	}
	return tag, err
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
