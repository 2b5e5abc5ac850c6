package listener

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// recordingTopic records what a Listener tells it, in order, and the backend of the
// connection it was told on.
type recordingTopic struct {
	mu     sync.Mutex
	events []string
	pids   []uint32
	// failConnect makes the next Connected calls fail, as a re-read that cannot run.
	failConnect int
	changed     chan struct{}
}

func newRecordingTopic() *recordingTopic { return &recordingTopic{changed: make(chan struct{}, 100)} }

func (r *recordingTopic) record(e string, conn *pgx.Conn) {
	r.mu.Lock()
	r.events = append(r.events, e)
	if conn != nil {
		r.pids = append(r.pids, conn.PgConn().PID())
	}
	r.mu.Unlock()
	r.changed <- struct{}{}
}

func (r *recordingTopic) Connected(_ context.Context, conn *pgx.Conn, reconnect bool) error {
	r.mu.Lock()
	fail := r.failConnect > 0
	if fail {
		r.failConnect--
	}
	r.mu.Unlock()
	if fail {
		r.record("connect failed", nil)
		return errors.New("re-read failed")
	}
	if reconnect {
		r.record("reconnected", conn)
	} else {
		r.record("connected", conn)
	}
	return nil
}

func (r *recordingTopic) Notify(_ context.Context, conn *pgx.Conn, payload string) error {
	r.record("notify "+payload, conn)
	return nil
}

func (r *recordingTopic) Disconnected(stopped bool) {
	if stopped {
		r.record("stopped", nil)
		return
	}
	r.record("disconnected", nil)
}

func (r *recordingTopic) snapshot() ([]string, []uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...), append([]uint32(nil), r.pids...)
}

// waitFor waits until the topic's events end with want.
func (r *recordingTopic) waitFor(t *testing.T, want ...string) {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		events, _ := r.snapshot()
		if len(events) >= len(want) {
			tail := events[len(events)-len(want):]
			if equal(tail, want) {
				return
			}
		}
		select {
		case <-r.changed:
		case <-deadline:
			t.Fatalf("topic events %q do not end with %q within %s", events, want, waitTimeout)
		}
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func (b *bundle) notifyOn(t *testing.T, channel, payload string) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), "SELECT pg_notify($1, $2)", channel, payload)
	require.NoError(t, err)
}

// One connection carries the wake-ups and every topic: each topic is told it is
// connected once LISTEN runs, and then hears its own channel's notifications, and
// only those, on the same backend as the wake-ups.
func TestListener_TopicsHearTheirChannelsOnTheWakeConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{})
	tokens, values := newRecordingTopic(), newRecordingTopic()
	b.l.Listen("certworker_test_tokens", tokens)
	b.l.Listen("certworker_test_values", values)
	b.start(t)
	tokens.waitFor(t, "connected")
	values.waitFor(t, "connected")

	b.notifyOn(t, "certworker_test_tokens", "t1")
	b.notifyOn(t, "certworker_test_values", "v1")
	b.notify(t)
	tokens.waitFor(t, "connected", "notify t1")
	values.waitFor(t, "connected", "notify v1")
	require.Equal(t, SourceNotify, waitWake(t, b.l.Wakes()).Source)

	pid := b.l.backendPID.Load()
	for _, topic := range []*recordingTopic{tokens, values} {
		_, pids := topic.snapshot()
		for _, p := range pids {
			require.Equal(t, pid, p, "a topic was told on a connection other than the listener's")
		}
	}
	var sessions int
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND datname = current_database()`).Scan(&sessions))
	require.Equal(t, 1, sessions, "one listening session for the wake-ups and both topics")
}

// A lost connection is reported to every topic, and the new one too, so that each
// re-reads what it may have missed; their notifications flow again after it.
func TestListener_EveryTopicIsToldOfALostConnectionAndTheReconnect(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	tokens, values := newRecordingTopic(), newRecordingTopic()
	b.l.Listen("certworker_test_tokens", tokens)
	b.l.Listen("certworker_test_values", values)
	b.start(t)

	old := b.l.backendPID.Load()
	_, err := b.pool.Exec(context.Background(), "SELECT pg_terminate_backend($1)", int32(old))
	require.NoError(t, err)
	tokens.waitFor(t, "connected", "disconnected", "reconnected")
	values.waitFor(t, "connected", "disconnected", "reconnected")
	require.Equal(t, SourceReconnect, waitWake(t, b.l.Wakes()).Source)
	require.NotEqual(t, old, b.l.backendPID.Load())

	b.notifyOn(t, "certworker_test_values", "after")
	values.waitFor(t, "reconnected", "notify after")
}

// A topic whose re-read fails at a reconnection makes the connection count as lost:
// it is made again, with backoff, until every topic has re-read, so that no topic
// serves from a memory that missed notifications.
func TestListener_ATopicThatCannotReReadGetsTheConnectionMadeAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	tokens := newRecordingTopic()
	b.l.Listen("certworker_test_tokens", tokens)
	b.start(t)
	tokens.mu.Lock()
	tokens.failConnect = 2
	tokens.mu.Unlock()

	_, err := b.pool.Exec(context.Background(), "SELECT pg_terminate_backend($1)", int32(b.l.backendPID.Load()))
	require.NoError(t, err)
	tokens.waitFor(t, "connect failed", "disconnected", "connect failed", "disconnected", "reconnected")
	// The topic re-reads inside the connection's set-up, before the listener marks
	// itself connected and sends the catch-up wake-up: that wake-up is the signal.
	require.Equal(t, SourceReconnect, waitWake(t, b.l.Wakes()).Source)
	require.True(t, b.l.Connected())
}

// Topics are wiring: one added after Start, or a second for a channel, is a mistake
// the process's author makes, and panics rather than being silently ignored.
func TestListener_ListenAfterStartOrTwiceForAChannelPanics(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{})
	b.l.Listen("certworker_test_tokens", newRecordingTopic())
	require.Panics(t, func() { b.l.Listen("certworker_test_tokens", newRecordingTopic()) })
	require.Panics(t, func() { b.l.Listen(Channel, newRecordingTopic()) })
	b.start(t)
	require.Panics(t, func() { b.l.Listen("certworker_test_other", newRecordingTopic()) })
}

// A Listener that is stopped tells its topics so (stopped), so that a topic warns
// only of a lost connection, not at every orderly shutdown.
func TestListener_StopIsToldToTheTopicsAsAStopNotALoss(t *testing.T) {
	t.Parallel()
	b := setup(t, Options{})
	tokens := newRecordingTopic()
	b.l.Listen("certworker_test_tokens", tokens)
	b.start(t)
	tokens.waitFor(t, "connected")
	b.l.Stop()
	tokens.waitFor(t, "connected", "stopped")
}
