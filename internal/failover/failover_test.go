package failover

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/workertest"
)

// readyBound is the failover's promise (docs/high-availability.md, "Failover"):
// every instance is ready again within 5 s of the promotion completing.
const readyBound = 5 * time.Second

// hadOutage is how long the primary is gone before the standby is promoted in the
// test of a late promotion: an HA manager notices the death only after its own
// timeout (Patroni's ttl is 30 s by default; 20 s here keeps the test short), and
// a reconnection backoff that grows through the outage is what it catches.
const hadOutage = 20 * time.Second

// A standby that has received everything, promoted at once: no domain is lost and
// none is finalized twice. Three orders are in flight when the primary dies (their
// challenges validated, their answers held by the front, and let go as it dies), and
// two instances carry on against the promoted standby through the multi-host URL:
// each order confirms its claim there before its finalize (trying again while there
// is no primary), finds it held, and finishes; each domain has
// one order and one finalize at the CA, and nothing was charged. A domain verified
// after the promotion is issued too.
func TestFailover_CaughtUpStandbyLosesNothingAndFinalizesNothingTwice(t *testing.T) {
	w := newWorld(t)
	front := pebbletest.NewFront(t, w.ca)
	hold := make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	t.Cleanup(release)
	front.Add(pebbletest.Rule{Step: pebbletest.StepChallenge, Answer: pebbletest.Answer{Hold: hold}})
	a := w.start(t, "a", front.DirectoryURL)
	b := w.start(t, "b", front.DirectoryURL)
	waitReady(t, a, b)

	names := []string{randomName("caught-up"), randomName("caught-up"), randomName("caught-up")}
	ids := w.addDomains(t, names...)
	workertest.Eventually(t, time.Minute, "three orders in flight, held after their challenge", func() bool { return front.Holding() == 3 })
	w.waitValidated(t, names...)
	w.pair.WaitCaughtUp(t)
	w.pair.KillPrimary(t, false)
	// Released before the promotion: the orders reach their finalize while there is
	// no primary, and confirm their claims once there is one again.
	release()
	promoted := w.pair.Promote(t)

	workertest.Eventually(t, 2*time.Minute, "the three domains active", func() bool {
		for _, id := range ids {
			if w.domain(t, id).Status != "active" {
				return false
			}
		}
		return true
	})
	t.Logf("the orders in flight finished %s after the promotion", time.Since(promoted).Round(time.Millisecond))
	for i, n := range names {
		require.Len(t, w.ordersFor(n), 1, "%s was ordered again", n)
		require.Equal(t, 1, w.finalized(n), "%s: finalizes at the CA", n)
		require.Zero(t, w.domain(t, ids[i]).Attempts, "%s: the failover was charged", n)
	}
	require.Equal(t, 3, w.ca.Requests()[pebbletest.StepFinalize], "finalize requests at the CA")

	later := randomName("after")
	id := w.addDomains(t, later)[0]
	workertest.Eventually(t, time.Minute, "the domain verified after the promotion to be issued", func() bool { return w.domain(t, id).Status == "active" })
}

// Promoted 20 s after the primary died, the standby has every instance ready again,
// listener included, within 5 s (readyBound), in both wake modes; and a domain
// verified then is claimed on a wake-up from the listener (the safety-net poll is
// ten minutes away). The dead primary is listed first in the URL and vanished
// without a goodbye (its address answers nothing), so a connection to it takes the
// whole connect timeout of its host.
//
// Guards against the reconnection backoff growing through the outage (it had reached
// 10 to 19 s between tries, and the instances were ready again 15 and 24 s after the
// promotion), and against a connect timeout that spends the attempt on the dead
// first host (10 s, the listener's whole attempt, so that the second host was never
// asked). Readiness is measured as a probe sees it: /readyz is asked every 100 ms,
// each probe on its own, until promotion + 5 s; an instance ready later fails.
func TestFailover_PromotedAfter20sEveryInstanceIsReadyWithin5s(t *testing.T) {
	for _, wake := range []string{"notify", "logical"} {
		t.Run(wake, func(t *testing.T) {
			w := newWorld(t)
			a := w.start(t, "a", w.ca.DirectoryURL, "--wake", wake)
			b := w.start(t, "b", w.ca.DirectoryURL, "--wake", wake)
			waitReady(t, a, b)

			died := time.Now()
			w.pair.KillPrimary(t, true)
			workertest.Eventually(t, time.Minute, "both instances to report not ready", func() bool { return !a.ready() && !b.ready() })
			// The HA manager's wait before it promotes: the outage itself, not a
			// wait for an event.
			time.Sleep(time.Until(died.Add(hadOutage)))
			promoted := w.pair.Promote(t)

			readyIn, why := probeReadiness(promoted, promoted.Add(readyBound), a, b)
			t.Logf("--wake %s: promoted %s after the primary died; ready again %s (a) and %s (b) after the promotion",
				wake, promoted.Sub(died).Round(time.Millisecond), readyIn.of(a), readyIn.of(b))
			if len(readyIn) < 2 {
				t.Logf("sessions on the promoted server %s after the promotion:\n%s", time.Since(promoted).Round(time.Millisecond), w.sessions(t))
			}
			for _, p := range []*proc{a, b} {
				require.Contains(t, readyIn, p, "%s was not ready within %s of the promotion; its last probe: %s", p.name, readyBound, why[p])
			}

			name := randomName("after-promotion")
			id := w.addDomains(t, name)[0]
			workertest.Eventually(t, time.Minute, "the domain verified after the promotion to be claimed", func() bool {
				return len(a.lines("order started", name))+len(b.lines("order started", name)) > 0
			})
			started := append(a.lines("order started", name), b.lines("order started", name)...)
			require.Len(t, started, 1)
			// From the listener either way: its NOTIFY or logical message, or the pass
			// its own reconnection starts, when the verify lands while it reconnects
			// (seen with --wake logical on a loaded machine). Not the poll, ten minutes
			// away, nor a timer.
			require.Contains(t, []any{"notify", "reconnect"}, started[0]["source"], "claimed on a wake-up from the %s listener", wake)
			workertest.Eventually(t, time.Minute, "the domain to be issued", func() bool { return w.domain(t, id).Status == "active" })
		})
	}
}

// readiness is how long after the promotion each process first answered 200.
type readiness map[*proc]time.Duration

func (r readiness) of(p *proc) string {
	if d, ok := r[p]; ok {
		return d.String()
	}
	return "not ready"
}

// probeReadiness asks each process's /readyz every 100 ms, each probe in a goroutine
// of its own so that a slow answer delays no other, until deadline, and returns how
// long after from each process first answered 200 (absent: not before deadline), and
// the last answer of each that never did, with the time it came.
func probeReadiness(from, deadline time.Time, procs ...*proc) (readiness, map[*proc]string) {
	var mu sync.Mutex
	first := readiness{}
	why := map[*proc]string{}
	var probes sync.WaitGroup
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		mu.Lock()
		done := len(first) == len(procs)
		mu.Unlock()
		if done {
			break
		}
		for _, p := range procs {
			probes.Go(func() {
				sent := time.Now()
				ok, reason := p.readiness()
				at := time.Now()
				mu.Lock()
				defer mu.Unlock()
				if !ok {
					why[p] = fmt.Sprintf("%q, sent %s after the promotion, answered in %s",
						reason, sent.Sub(from).Round(time.Millisecond), at.Sub(sent).Round(time.Millisecond))
					return
				}
				if _, seen := first[p]; !seen && !at.After(deadline) {
					first[p] = at.Sub(from).Round(time.Millisecond)
				}
			})
		}
		<-tick.C
	}
	probes.Wait()
	return first, why
}

// A standby that lagged loses a claim with the primary: the instance that held it
// sends no finalize. The replication stream is cut before the claim, so the standby
// never receives it; the holder's order passes validation, and its answer is held
// while the primary dies and the standby is promoted, where the row is pending
// again. An instance claims it there and issues the certificate. Then the old
// holder's order goes on to its finalize: it must confirm its claim on the database
// first, finds it gone, and sends the CA nothing. One finalize at the CA for the
// name, the new holder's.
//
// Guards against a finalize gated only by the local lease deadline, which the
// failover did not touch: the old holder finalized 3 s after the promotion, and the
// name had two certificates. The lease is long (5 minutes: a heartbeat every 100 s)
// so that no heartbeat comes in between to notice the lost claim first.
func TestFailover_ClaimLostWithALaggingStandbySendsNoFinalize(t *testing.T) {
	w := newWorld(t)
	name := randomName("lagging")
	id := w.addDomains(t, name)[0]
	w.pair.WaitCaughtUp(t)
	w.pair.CutReplication()

	front := pebbletest.NewFront(t, w.ca)
	hold := make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	t.Cleanup(release)
	// The first challenge only: the order that claims the row again after the
	// failover goes through.
	front.Add(pebbletest.Rule{Step: pebbletest.StepChallenge, Times: 1, Answer: pebbletest.Answer{Hold: hold}})
	a := w.start(t, "a", front.DirectoryURL, "--lease", "5m")
	b := w.start(t, "b", front.DirectoryURL, "--lease", "5m")
	workertest.Eventually(t, time.Minute, "the first order to be held after its challenge", func() bool { return front.Holding() == 1 })
	w.waitValidated(t, name)
	holder := a
	if len(a.lines("order started", name)) == 0 {
		holder = b
	}
	require.Len(t, holder.lines("order started", name), 1)

	w.pair.KillPrimary(t, false)
	promoted := w.pair.Promote(t)
	workertest.Eventually(t, 2*time.Minute, "the promoted standby's claim to be issued", func() bool { return w.domain(t, id).Status == "active" })
	require.Equal(t, 1, w.finalized(name), "the new holder's finalize")
	release()

	workertest.Eventually(t, time.Minute, "the old holder's order to end", func() bool {
		return len(holder.lines("order abandoned: the claim was lost to another instance", name)) > 0 ||
			len(holder.lines("result dropped: the claim was lost to another instance", name)) > 0
	})
	t.Logf("old holder %s, new order issued %s after the promotion", holder.name, time.Since(promoted).Round(time.Millisecond))
	require.Len(t, w.ordersFor(name), 2, "the old holder's order and the new one")
	require.Equal(t, 1, w.finalized(name), "finalizes at the CA: the old holder must not finalize")
	require.Len(t, holder.lines("claim lost before the finalize: the database does not hold it (another instance or an operator took the domain, or a failover lost the claim); nothing is sent to the CA", name), 1)
	d := w.domain(t, id)
	require.Equal(t, "active", d.Status)
	require.Zero(t, d.Attempts)
}
