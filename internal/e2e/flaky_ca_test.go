package e2e

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue/worker"
)

// A CA that validates slowly and rejects a fifth of the nonces, as Let's Encrypt's
// staging does now and then: every domain is still issued, at concurrency 4, and
// none is charged an attempt. Guards against a rejected nonce surfacing as a failed
// order (lego retries badNonce; a client that did not would fail one request in
// five), against orders in flight at once sharing a nonce or an HTTP-01 token, and
// against a validation that takes seconds being cut short by a timeout.
//
// Pebble's validation sleep is a whole number of seconds below SleepSeconds, drawn
// for each of its three validation requests: with 2, a validation takes 0 or 1 s.
func TestE2E_ValidationSleepAndNonceRejection(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{ValidationSleep: true, SleepSeconds: 2, NonceReject: 20})
	in := w.startWorker(t, "flaky", w.acmeConfig(), worker.Config{Concurrency: 4, PollInterval: 30 * time.Second})

	names := make([]string, 5)
	for i := range names {
		names[i] = randomName("flaky")
	}
	start := time.Now()
	ids := w.addDomains(t, names...)
	waitFor(t, 2*time.Minute, "every domain to be issued", func() bool { return w.statuses(t)["active"] == len(ids) })
	t.Logf("5 domains issued in %s; the CA saw %d new-order requests for %d orders (rejected nonces are retried)",
		time.Since(start).Round(time.Millisecond), w.ca.OrderRequests(), len(w.ca.Orders()))

	for i, id := range ids {
		d := w.domain(t, id)
		require.Equal(t, "active", d.Status, names[i])
		require.Equal(t, 0, d.Attempts, "%s: an attempt was charged", names[i])
		require.Nil(t, d.Error, names[i])
		require.Equal(t, 1, ordersStarted(in, names[i]), "%s: one order, not a retried one", names[i])
		require.Len(t, ordersFor(w.ca, names[i]), 1, "%s: orders the CA accepted", names[i])
	}
}
