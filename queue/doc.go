// Package queue owns every statement that moves a domain between SSL states
// (docs/internals.md).
//
//	pending ──claim──▶ provisioning ──issued──▶ active ──renewal due──▶ pending
//	   ▲                    │
//	   └──failure (backoff)─┤──at the attempt limit / invalid name──▶ failed
//	   └──hand-back, reclaim┘                                            │
//	   └──────────────────────────── retry ◀─────────────────────────────┘
//
// The claim decides what is due in one statement (FOR UPDATE SKIP LOCKED), so any
// number of instances can run; NOTIFY, timers and the poll only say "look now".
//
// A claim is a lease, renewed while the order runs (Heartbeat), never once it has run
// out. Every finishing write checks the claim token, and the instance stops its order
// at a local Deadline before the database lets another instance reclaim the row.
package queue
