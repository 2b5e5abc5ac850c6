package acme_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue/issuing"
)

// requestsPerOrder issues one order to warm the issuer up (the account's
// registration), then n more, and returns what the CA saw for the warm-up and, per
// step, for the n orders together, and how many of the CA's answers to their
// finalize requests and order polls said the order was still being issued.
func requestsPerOrder(t *testing.T, b *bed, n int) (first, rest map[pebbletest.Step]int, firstIssuing, restIssuing int) {
	t.Helper()
	iss := newIssuer(t, b.pool, nil, b.config())
	ctx := testCtx(t, time.Minute)
	before, answersBefore := b.ca.Requests(), b.ca.OrderAnswers()
	_, err := iss.Issue(ctx, issuing.Request{Domain: randomName("q")})
	require.NoError(t, err)
	warm, answersWarm := b.ca.Requests(), b.ca.OrderAnswers()
	for range n {
		_, err := iss.Issue(ctx, issuing.Request{Domain: randomName("q")})
		require.NoError(t, err)
	}
	return diff(warm, before), diff(b.ca.Requests(), warm), stillIssuing(diff(answersWarm, answersBefore)),
		stillIssuing(diff(b.ca.OrderAnswers(), answersWarm))
}

// stillIssuing is how many of the order answers counted in m (by status) said the
// CA had not finished the order.
func stillIssuing(m map[string]int) int {
	n := 0
	for status, count := range m {
		if status != "valid" && status != "invalid" {
			n += count
		}
	}
	return n
}

func diff[K comparable](after, before map[K]int) map[K]int {
	out := map[K]int{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

func total(m map[pebbletest.Step]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func format(m map[pebbletest.Step]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// What one order costs the CA, counted at Pebble by step, at a CA that says when to
// look at the authorization again (a Retry-After of 1 s on its answer to the
// challenge). Orders share the account, the directory and unused nonces: after the
// first, an order sends only what it needs (new order, the authorization and its
// challenge, one poll of the authorization after the CA's Retry-After, finalize, one
// poll of the order, the certificate, its renewal information): 8 requests, where a
// lego client per order sent 11 (directory, nonce and two more authorization polls).
// Guards against orders that fetch the directory or a fresh nonce again, poll more
// than they need to, or look early at an authorization the CA said to look at later.
//
// The order is polled once for each answer (the finalize's, then each poll's) that
// said the CA was still issuing it: Pebble issues in the background, so that is one
// poll an order on a quiet machine, and a second when the CA was slow (seen once
// beside a CPU hog: 6 polls for 5 orders).
func TestIssue_RequestsPerOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{ChallengeRetryAfter: time.Second}, true)
	const n = 5
	first, rest, firstIssuing, restIssuing := requestsPerOrder(t, b, n)
	t.Logf("first order (registers the account): %d requests: %s", total(first), format(first))
	t.Logf("each of %d further orders: %.1f requests: %s", n, float64(total(rest))/n, format(rest))
	t.Logf("answers that said the CA was still issuing: %d for the first order, %d for the others", firstIssuing, restIssuing)
	// The authorization is fetched once, and looked at again after the CA's Retry-After
	// unless the challenge's own answer already said it was valid (Pebble sometimes
	// validates before it answers): one or two looks an order, never more.
	authz := func(m map[pebbletest.Step]int, orders int) {
		t.Helper()
		require.GreaterOrEqual(t, m[pebbletest.StepAuthorization], orders)
		require.LessOrEqual(t, m[pebbletest.StepAuthorization], 2*orders, "looked at the authorization more often than the CA said to")
		delete(m, pebbletest.StepAuthorization)
	}
	authz(first, 1)
	authz(rest, n)
	orderPolls := func(m map[pebbletest.Step]int, issuing int) {
		t.Helper()
		require.Equal(t, issuing, m[pebbletest.StepOrder], "order polls, for %d answers that said the CA was still issuing", issuing)
		delete(m, pebbletest.StepOrder)
	}
	orderPolls(first, firstIssuing)
	orderPolls(rest, restIssuing)
	require.Equal(t, map[pebbletest.Step]int{
		pebbletest.StepDirectory: 1, pebbletest.StepNonce: 1, pebbletest.StepNewAccount: 1,
		pebbletest.StepNewOrder: 1, pebbletest.StepChallenge: 1,
		pebbletest.StepFinalize: 1, pebbletest.StepCertificate: 1, pebbletest.StepRenewalInfo: 1,
	}, first)
	require.Equal(t, map[pebbletest.Step]int{
		pebbletest.StepNewOrder: n, pebbletest.StepChallenge: n,
		pebbletest.StepFinalize: n, pebbletest.StepCertificate: n, pebbletest.StepRenewalInfo: n,
	}, rest)
}

// Orders share the directory and nonces, yet each is cancelled on its own: an
// order held by the CA and cancelled returns at once, while another order running
// beside it on the same issuer completes, without fetching the directory again.
// (Its nonce it must fetch: the held order's request took the last one, and the
// CA never answered it.) Guards against a shared lego client whose cancellation would take
// every order with it, or whose lost cancellation would hold a slot until the CA
// answers.
func TestIssue_OrdersShareTheSessionButAreCancelledAlone(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	front := pebbletest.NewFront(t, b.ca)
	front.Add(pebbletest.Rule{Step: pebbletest.StepChallenge, Times: 1, Answer: pebbletest.Answer{Stall: 20 * time.Second}})
	iss := newIssuer(t, b.pool, nil, frontConfig(b, front))

	held, cancel := context.WithCancel(testCtx(t, 30*time.Second))
	defer cancel()
	heldErr := make(chan error, 1)
	go func() {
		_, err := iss.Issue(held, issuing.Request{Domain: randomName("held")})
		heldErr <- err
	}()
	require.Eventually(t, func() bool { return front.Answered()[pebbletest.StepChallenge] == 1 },
		10*time.Second, 10*time.Millisecond, "the first order reaches its challenge")

	otherErr := make(chan error, 1)
	go func() {
		_, err := iss.Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: randomName("free")})
		otherErr <- err
	}()
	cancel()
	select {
	case err := <-heldErr:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(2 * time.Second):
		t.Fatal("the cancelled order did not return")
	}
	select {
	case err := <-otherErr:
		require.NoError(t, err, "the other order is not cancelled with it")
	case <-time.After(20 * time.Second):
		t.Fatal("the other order did not finish")
	}
	require.Equal(t, 1, b.ca.Requests()[pebbletest.StepDirectory], "the directory is fetched once for both orders")
}
