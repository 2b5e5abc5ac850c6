package main

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/pgtest"
)

// joinSignal is a probe's context that says when the probe waits for its answer:
// readiness.check asks for Done only once it has joined a check.
type joinSignal struct {
	context.Context
	once   sync.Once
	joined chan<- struct{}
}

func (j *joinSignal) Done() <-chan struct{} {
	j.once.Do(func() { j.joined <- struct{}{} })
	return j.Context.Done()
}

// Probes that come while a check runs share its answer: twenty probes, one check.
// The probe that started it gives up (its client went away), and the check runs on
// to its end for the others, its context not cancelled.
//
// Guards against a check per probe: after a failover each wanted a connection of
// its own while every new one first waited out the dead host, and the queue of
// probes kept an instance from answering ready within the 5 s CONTRACT.md §5 gives.
func TestReadiness_ProbesThatComeWhileACheckRunsShareItsAnswer(t *testing.T) {
	const probes = 20
	var calls atomic.Int32
	entered, release := make(chan context.Context, probes), make(chan struct{})
	r := newReadiness(func(ctx context.Context) string {
		calls.Add(1)
		entered <- ctx
		<-release
		if ctx.Err() != nil {
			return "cancelled: " + ctx.Err().Error()
		}
		return "listener not connected"
	})

	first, abandon := context.WithCancel(context.Background())
	firstAnswer := make(chan string, 1)
	go func() { firstAnswer <- r.check(first) }()
	var checkCtx context.Context
	select {
	case checkCtx = <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first probe started no check")
	}

	joined := make(chan struct{}, probes)
	answers := make(chan string, probes)
	for range probes - 1 {
		go func() { answers <- r.check(&joinSignal{Context: context.Background(), joined: joined}) }()
	}
	for range probes - 1 {
		select {
		case <-joined:
		case <-time.After(10 * time.Second):
			t.Fatal("a probe neither joined the check under way nor answered")
		}
	}
	abandon()
	require.Equal(t, "readiness check abandoned: context canceled", <-firstAnswer)
	require.NoError(t, checkCtx.Err(), "the check was cancelled with the probe that started it")
	close(release)
	for range probes - 1 {
		require.Equal(t, "listener not connected", <-answers)
	}
	require.Equal(t, int32(1), calls.Load(), "checks run for %d probes", probes)

	// Once it ended, the next probe starts a check of its own.
	go func() { <-entered }()
	require.Equal(t, "listener not connected", r.check(context.Background()))
	require.Equal(t, int32(2), calls.Load())
}

// stubWorker is the worker as /readyz sees it.
type stubWorker struct {
	ready  bool
	halted error
}

func (s stubWorker) Ready() bool   { return s.ready }
func (s stubWorker) Halted() error { return s.halted }

// A check takes one connection of the pool for all it asks the database: the ping
// and both CAs' stored accounts. It said so before it took three; and a halted worker
// or a listener not connected is reported on that one connection. A pool that has no
// connection to give within the check's time is reported with how many it has and
// in what state, so that an operator tells a pool kept busy from a server away.
func TestReadiness_ACheckTakesOneConnectionOfThePool(t *testing.T) {
	t.Parallel()
	pool, dsn := pgtest.NewPool(t)
	ctx := context.Background()
	issuer := func(directory string) *acme.Issuer {
		i, err := acme.New(ctx, pool, zap.NewNop(), acme.Config{DirectoryURL: directory, HTTPTimeout: time.Second})
		require.NoError(t, err)
		return i
	}
	first, second := issuer("https://127.0.0.1:1/first"), issuer("https://127.0.0.1:1/second")
	for _, tc := range []struct {
		wk   stubWorker
		want string
	}{
		{stubWorker{ready: true}, ""},
		{stubWorker{ready: false}, "listener not connected"},
		{stubWorker{ready: true, halted: errors.New("--acme-profile: not offered")}, "--acme-profile: not offered"},
	} {
		before := pool.Stat().AcquireCount()
		require.Equal(t, tc.want, notReady(ctx, pool, tc.wk, first, second))
		require.Equal(t, before+1, pool.Stat().AcquireCount(), "connections taken by a check (%+v)", tc.wk)
	}

	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.MaxConns = 1
	one, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(one.Close)
	held, err := one.Acquire(ctx)
	require.NoError(t, err)
	defer held.Release()
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	require.Equal(t, "database unreachable (no connection of the pool: 1 of 1 in use, 0 being made)",
		notReady(short, one, stubWorker{ready: true}, first, second))
}
