// Package listener turns PostgreSQL notifications on the certworker_wake channel
// into wake-ups for the worker. It only ever says "look now": the claim query is the
// single source of correctness (CONTRACT.md §2), so a wake-up that is lost, merged or
// spurious costs latency at worst, never a certificate.
//
// # Overview
//
// The triggers on proxy_domains send NOTIFY certworker_wake when a row enters the
// claimable set. A Listener holds one dedicated connection that has run LISTEN
// certworker_wake and hands every notification to the worker as a Wake on the
// channel returned by Wakes. The shape is River's notifier (riverqueue/river,
// internal/notifier), which has been run against every way a PostgreSQL connection
// can go wrong:
//
//   - Connect once up front. Start dials, runs LISTEN and returns the error if that
//     fails, so a wrong DSN, host or password stops `certworker run` at start-up with
//     a message instead of a process that retries quietly for ever.
//   - Reconnect for ever after that, with jittered exponential backoff (Options.
//     BackoffMin doubling up to Options.BackoffMax). A database restart, a failover
//     or a terminated backend must not need an operator to restart the worker, and
//     the jitter keeps a fleet of instances that lost the same server from knocking
//     on it in lockstep.
//   - Ping on silence. A connection can die without a FIN (a NAT entry that expired,
//     a server that lost power): reads then block for ever, and a listener waiting
//     for notifications is the one client that never writes and so never finds out.
//     After Options.PingAfter without a notification the listener runs a query with
//     a deadline of Options.PingTimeout and reconnects if it does not answer. With
//     the defaults (10 s + 5 s) a half-open connection is found within 15 s.
//   - Polling stays. Notifications sent while the listener is away are gone for good
//     (PostgreSQL queues them only for sessions that are listening), so every
//     successful connection, the first included, emits a Wake with source
//     "reconnect" to make the worker catch up; and the worker keeps its
//     --poll-interval pass as the net under everything else.
//
// # Topics
//
// The same connection carries the process's other notification channels (the
// HTTP-01 tokens'), each a Topic added with Listen before Start: one connection, one
// reconnect and silence rule. A topic is told of every connection (Connected, with
// whether it is a reconnection) once LISTEN runs on every channel, so that it re-reads
// what it may have missed, and of every loss (Disconnected); an error from it counts
// as a lost connection.
//
// # Wake-ups
//
// Wakes returns a channel with a buffer of one. A wake-up that finds one already
// pending is merged into it instead of queued: a thousand notifications while the
// worker is busy become one more pass, not a thousand. Merging keeps the stronger
// reason: a pending "notify" that meets a "reconnect" becomes "reconnect", because a
// reconnect means notifications may have been missed and the worker logs the source
// of each pass. The channel is never closed; the consumer stops on its own context.
//
// Every source of a wake-up, the worker's own "timer" and "poll" included, is named
// here (SourceNotify, SourceReconnect, SourceTimer, SourcePoll) so that the values
// the logs carry (CONTRACT.md §6) live in one place.
//
// # State
//
// Connected reports whether the listener holds a live, listening connection; the
// admin server's /readyz answers 503 while it does not (CONTRACT.md §4). With
// Options.Registerer set, the same state is exported as the gauge
// certworker_listener_connected, next to certworker_listener_reconnects_total and
// certworker_listener_notifications_total.
//
// # Lifecycle
//
// New builds a Listener; Start connects and backgrounds it; it runs until Stop is
// called or the context given to Start is cancelled. Stop is safe before Start and
// safe twice, and returns only once the goroutine has finished and the connection is
// closed. A cancelled context is how a Listener is meant to end and is not logged as
// an error.
//
// # Logs
//
// Logs go to the logger given to New, under the name "listener": info when the
// connection is made or made again, warn with "error" and "retry_in" when it is lost
// or a reconnection fails. The connection string is never logged; pgx's connection
// errors name the host, user and database but not the password.
package listener
