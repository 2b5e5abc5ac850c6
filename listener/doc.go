// Package listener turns PostgreSQL notifications on the certworker_wake channel, or
// the changes of a logical replication stream (Logical), into wake-ups for the
// worker. A wake-up only says "look now": the claim statement decides what is due,
// so a wake-up lost, merged or spurious costs latency at worst, never a certificate.
//
// Every wake source keeps Waker's rules. The Listener has River's notifier's shape
// (riverqueue/river, internal/notifier): one connection of its own, made once up
// front, then kept up with jittered backoff (session.keepUp), checked when silent
// (Listener.ping, since a half-open connection blocks a reader that never writes),
// and a catch-up pass on every connection, since a notification sent while nobody
// listened is gone. The worker's --poll-interval pass stays as the net under it all.
// The same connection carries the process's other channels, each a Topic.
package listener
