// Package queue owns every statement that moves a domain between SSL states, and the
// worker loop that drives them.
//
// # State model
//
//	pending ──claim──▶ provisioning ──issued──▶ active ──renewal due──▶ pending
//	   ▲                    │
//	   └──failure (backoff)─┤──at the attempt limit / invalid name──▶ failed
//	   └──hand-back, reclaim┘                                            │
//	   └──────────────────────────── retry ◀─────────────────────────────┘
//
// A domain is claimable when it is verified, its provider is acme, it is pending, its
// attempts are below the limit and its backoff has elapsed. The claim query decides
// that in one statement (FOR UPDATE SKIP LOCKED), so any number of instances can run;
// everything else (NOTIFY, timers, the poll) only says "look now".
//
// # A second CA
//
// With Config.Fallback, the same statement decides which of two CAs each row's order
// goes to, from the pauses of each (kept per CA), and records the decision on the row
// (fallback.go): the first CA unless it has held the domain back for longer than
// Fallback.After, or refused the name.
//
// # Leases
//
// A claim is a lease: the claiming instance stamps a claim token and renews
// ssl_lease_expires_at while the order runs (Heartbeat), never once it has run out.
// Every write that finishes an order checks the token, so an instance that lost its
// claim cannot overwrite the instance that took it over. The instance also keeps a
// local Deadline for each claim, a lease less LeaseMargin from the send of its last
// renewal, past which the order sends the CA nothing more (Issuer): by the time the
// database lets another instance reclaim the row, its holder has stopped. A row whose
// lease ran out is requeued by the reclaim, with the attempt counted, since a crash
// and a stopped order look alike; the stopped order's instance hands it back
// uncharged if it reaches the database first.
//
// # Failure handling
//
// The worker never exits on a database error: it logs, waits for the next wake, and
// the claim query picks up where it left off. Results are recorded with retries;
// a result that cannot be recorded leaves a lease that runs out.
package queue
