// Package listener turns PostgreSQL notifications on the certworker_wake channel, or
// the changes of a logical replication stream (Logical), into wake-ups for the
// worker. A wake-up only says "look now": the claim statement decides what is due,
// so a wake-up lost, merged or spurious costs latency at worst, never a certificate.
//
// Each wake source keeps Waker's rules: a connection of its own, kept up with jittered
// backoff, checked when silent (a half-open one blocks a reader for ever), and a catch-up
// pass on every connection. The listener's also carries the process's other channels.
package listener
