package listener

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Topic consumes one notification channel on the Listener's connection. The Listener
// calls its methods on its goroutine, one at a time; they may run statements on conn,
// and an error from any counts as a lost connection.
type Topic interface {
	// Connected is called after every connection, once LISTEN runs and before any
	// notification: the topic re-reads what it may have missed.
	Connected(ctx context.Context, conn *pgx.Conn, reconnect bool) error
	// Notify is called with the payload of each notification on the topic's channel.
	Notify(ctx context.Context, conn *pgx.Conn, payload string) error
	// Disconnected is called when the connection is lost, or closed by Stop (stopped).
	Disconnected(stopped bool)
}

// Listen adds t as the consumer of channel's notifications on the wake-ups' connection.
// It panics after Start, or for a channel that has one: a mistake of the wiring.
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

// listenTopics runs LISTEN for every topic's channel on conn, then calls Connected.
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
