package listener

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Topic is what one notification channel's consumer does with the process's one
// listening connection. A Listener calls its methods on its own goroutine, one at a
// time; they may run statements on conn, which stays the Listener's, and an error
// from any of them counts as a lost connection (closed, and made again with backoff).
type Topic interface {
	// Connected is called after every connection, the first included, once LISTEN
	// runs on every channel and before any notification is handed over: the topic
	// re-reads what it may have missed while no connection listened.
	Connected(ctx context.Context, conn *pgx.Conn, reconnect bool) error
	// Notify is called with the payload of each notification on the topic's channel.
	Notify(ctx context.Context, conn *pgx.Conn, payload string) error
	// Disconnected is called when the connection is lost, or closed because the
	// Listener was stopped (stopped): only a loss is worth a warning.
	Disconnected(stopped bool)
}

// Listen adds t as the consumer of channel's notifications, on the same connection
// as the wake-ups. Topics are added before Start; Listen panics after it, or for a
// channel that already has one, as both are mistakes of the wiring, not of the
// database.
func (l *Listener) Listen(channel string, t Topic) {
	l.topicsMu.Lock()
	defer l.topicsMu.Unlock()
	if l.started {
		panic("listener: Listen after Start")
	}
	if _, ok := l.topics[channel]; ok || channel == Channel {
		panic(fmt.Sprintf("listener: channel %s has a topic already", channel))
	}
	if l.topics == nil {
		l.topics = map[string]Topic{}
	}
	l.topics[channel] = t
}

// listenTopics runs LISTEN for every topic's channel on conn, then tells each topic
// that it is connected, so that anything committed from then on arrives as a
// notification and anything before is found by the topic's own re-read.
func (l *Listener) listenTopics(ctx context.Context, conn *pgx.Conn, reconnect bool) error {
	for channel := range l.topics {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
			return fmt.Errorf("listen on %s: %w", channel, err)
		}
	}
	for channel, t := range l.topics {
		if err := t.Connected(ctx, conn, reconnect); err != nil {
			for _, u := range l.topics {
				u.Disconnected(false)
			}
			return fmt.Errorf("%s: %w", channel, err)
		}
	}
	return nil
}

// channels is every channel the connection listens on, for the silence check.
func (l *Listener) channels() []string {
	out := []string{Channel}
	for channel := range l.topics {
		out = append(out, channel)
	}
	return out
}
