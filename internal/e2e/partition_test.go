package e2e

// A cut-off instance stops in time (issue #17): an instance that cannot renew its
// lease, cut off from PostgreSQL alone or paused, sends the CA nothing more for its
// order once its lease deadline has passed, so that an instance that reclaims the
// domain never orders it side by side with it.

import (
	"net/http"
	"net/url"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// orderStoppedAtDeadline is what the worker logs when an order's lease deadline
// stops it.
const orderStoppedAtDeadline = "order stopped at its lease deadline: the lease could not be renewed in time; nothing more is sent to the CA, and the claim is handed back uncharged once the database answers"

// partitionLease is the lease of these tests: short, so that they run in seconds
// (the shortest `run` accepts).
const partitionLease = 3 * time.Second

// holdChallenge makes the front hold the CA's answer to the first challenge POST
// until the returned function is called (or the test ends): an order waiting on the
// CA.
func holdChallenge(t *testing.T, front *pebbletest.Front) (release func()) {
	t.Helper()
	hold := make(chan struct{})
	front.Add(pebbletest.Rule{Step: pebbletest.StepChallenge, Times: 1, Answer: pebbletest.Answer{Hold: hold}})
	released := false
	release = func() {
		if !released {
			released = true
			close(hold)
		}
	}
	t.Cleanup(release)
	return release
}

// finalized counts the orders for name whose finalize the CA accepted.
func finalized(ca *pebbletest.CA, name string) int {
	n := 0
	for _, o := range ordersFor(ca, name) {
		if o.Finalized {
			n++
		}
	}
	return n
}

// urlPath is u's path: the CA's URLs name the host the client used, the path is the
// resource.
func urlPath(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return u
	}
	return p.Path
}

// sentFor is what the front saw after since for the order o: a request to its own
// URL, its finalize URL or one of its authorizations that no later order shares (a
// CA may hand a later order the same valid authorization; Pebble does, rarely, even
// with AuthzReuse 0).
func sentFor(front *pebbletest.Front, o pebbletest.Order, later []pebbletest.Order, since time.Time) []pebbletest.Seen {
	paths := []string{urlPath(o.URL), urlPath(o.Finalize)}
	for _, a := range o.Authorizations {
		shared := slices.ContainsFunc(later, func(l pebbletest.Order) bool { return slices.Contains(l.Authorizations, a) })
		if !shared {
			paths = append(paths, urlPath(a))
		}
	}
	var out []pebbletest.Seen
	for _, s := range front.Seen() {
		if s.At.After(since) && slices.Contains(paths, s.Path) {
			out = append(out, s)
		}
	}
	return out
}

// Instance A reaches PostgreSQL through a relay and the CA through a front. Its
// order waits on the CA's answer to its challenge (held at the front) when the relay
// is cut. A's last renewal was sent before the cut, so its deadline falls within a
// lease of it; the CA's answer is let through only after that. Instance B, healthy,
// reclaims the domain once A's lease has run out and issues it. A sends the front
// nothing after its deadline (the front sees only A), the domain ends with exactly
// one finalized order at the CA, B's, and A, back on the database, finds its claim
// gone and writes nothing. The order used to run on through the cut: A took the late
// answer, polled and finalized, and the domain was issued twice.
func TestPartition_ACutOffInstanceSendsTheCANothingAfterItsDeadline(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	front := pebbletest.NewFront(t, w.ca)
	release := holdChallenge(t, front)
	relay, cutOffDSN := workertest.Relayed(t, w.dsn)
	cfg := worker.Config{Queue: issuing.Config{Lease: partitionLease, RetryBase: time.Second},
		Concurrency: 1, PollInterval: time.Second}
	viaFront := w.acmeConfig()
	viaFront.DirectoryURL = front.DirectoryURL
	a := w.startWorkerOn(t, "cut-off", cutOffDSN, viaFront, cfg)
	name := randomName("partition")
	id := w.addDomains(t, name)[0]
	waitFor(t, 30*time.Second, "A's order to wait on the CA's answer to its challenge", func() bool { return front.Holding() == 1 })

	relay.Cut()
	deadline := time.Now().Add(partitionLease) // at the latest
	b := w.startWorker(t, "healthy", w.acmeConfig(), cfg)
	waitFor(t, 2*partitionLease, "A's deadline to pass", func() bool { return time.Now().After(deadline) })
	release() // the CA's answer, after A's deadline
	waitFor(t, time.Minute, "B to issue the domain", func() bool { return w.domain(t, id).Status == "active" })

	relay.Restore()
	a.WaitForLog(t, "result dropped: the claim was lost to another instance", 1, time.Minute)
	for _, s := range front.Seen() {
		require.False(t, s.At.After(deadline), "A sent %s %s %s after its deadline", s.Step, s.Path, s.At.Sub(deadline))
	}
	require.Equal(t, 1, finalized(w.ca, name), "finalized orders at the CA")
	require.Equal(t, 1, ordersStarted(b, name))
	require.Zero(t, a.Metric(t, "certworker_issuance_total", "issued"))
	require.Equal(t, 1, a.Logs.FilterMessage(orderStoppedAtDeadline).Len())
}

// The same with the real `run` binary paused instead of cut off: SIGSTOP while its
// order waits on the CA (the answer held at the front), SIGCONT once its deadline
// and its lease have run out, with the CA's answer waiting in its socket. Nobody else
// runs, so nobody reclaims: the instance itself finds its lease expired. The stopped
// order sends the CA nothing more (no poll of its authorization, no finalize under
// the stale claim), the claim goes back uncharged, and the domain's next claim resumes
// the recorded order from where the CA has it (ready: finalized, no new order): one
// order and one finalize at the CA, attempts 0. The heartbeat used to renew the
// expired lease on waking, and the old order polled and finalized as if nothing had
// happened.
func TestProcess_AnInstancePausedPastItsDeadlineSendsTheCANothingMoreForItsOrder(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	front := pebbletest.NewFront(t, w.ca)
	release := holdChallenge(t, front)
	p := startProc(t, "paused", w.dsn, front.DirectoryURL, w.rootsFile,
		"--lease", partitionLease.String(), "--concurrency", "1", "--poll-interval", "1s", "--retry-base", "1s",
		"--http01-listen", "") // the test's responder answers the CA, also while the process is stopped
	waitFor(t, 30*time.Second, "the process to be ready", func() bool { code, _ := p.get("/readyz"); return code == http.StatusOK })
	name := randomName("paused")
	id := w.addDomains(t, name)[0]
	waitFor(t, 30*time.Second, "the order to wait on the CA's answer to its challenge", func() bool { return front.Holding() == 1 })

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGSTOP))
	stopped := time.Now()
	// Past its deadline (within a lease of the stop) and past the lease the
	// database holds for it.
	waitFor(t, 4*partitionLease, "two leases", func() bool { return time.Since(stopped) > 2*partitionLease })
	release()
	waitFor(t, 10*time.Second, "the held answer to be written", func() bool { return front.Holding() == 0 })
	resumed := time.Now()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGCONT))

	waitFor(t, time.Minute, "the domain to be issued", func() bool { return w.domain(t, id).Status == "active" })
	orders := ordersFor(w.ca, name)
	require.Len(t, orders, 1, "the recorded order was placed again instead of resumed")
	for _, s := range sentFor(front, orders[0], nil, resumed) {
		// The resumed order asks for the order and finalizes it; the stopped one would
		// have polled its authorization first.
		require.NotContains(t, []pebbletest.Step{pebbletest.StepAuthorization, pebbletest.StepChallenge}, s.Step,
			"the paused instance went on with its old order: %s %s", s.Step, s.Path)
	}
	require.Contains(t, p.logs.String(), "resuming the recorded order")
	require.Equal(t, 1, finalized(w.ca, name), "finalized orders at the CA")
	require.Zero(t, w.domain(t, id).Attempts, "the hand-back was charged")
	require.Contains(t, p.logs.String(), orderStoppedAtDeadline)
	require.NotContains(t, p.logs.String(), "domain was left mid-issuance by an instance that stopped; requeued",
		"the resumed instance reclaimed its own claim, charging it, before handing it back")
}
