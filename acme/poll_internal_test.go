package acme

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const ms = time.Millisecond

// looksUntil is how many looks a poll whose first look is at first takes to see work
// the CA finished at ready (an offset from the poll's start), at a CA that says
// nothing of when to look and answers at once.
func looksUntil(first, ready time.Duration) int {
	n := 1
	for at := first; at < ready; at = lookAfter(at) {
		n++
	}
	return n
}

// previousLooks is how many looks the schedule before the curve took (two early
// looks, 25 and 100 ms after the challenge's answer, 10 and 50 ms after the
// finalize, both kinds spent once two of them had found the CA at work; then 1 s
// for the authorization, 500 ms for the order, each wait half as long again) to see
// an authorization valid at validation and an order issued at issue. Kept to set
// the curve's cost against it.
func previousLooks(validation, issue time.Duration) (authz, order int) {
	wasted := 0
	looks := func(early []time.Duration, first, ready time.Duration) int {
		n := 0
		for _, at := range early {
			if wasted >= 2 {
				break
			}
			n++
			if at >= ready {
				return n
			}
			wasted++
		}
		for at, wait := first, first; ; wait = min(wait*3/2, pollMax) {
			n++
			if at >= ready {
				return n
			}
			at += min(wait*3/2, pollMax)
		}
	}
	authz = looks([]time.Duration{25 * ms, 100 * ms}, time.Second, validation)
	order = looks([]time.Duration{10 * ms, 50 * ms}, 500*ms, issue)
	return authz, order
}

// requestsPerOrder is what an order sends the CA, with the account and nonces known
// (new order, authorization, challenge, finalize, certificate, renewal information),
// plus its looks at the authorization and at the order.
func requestsPerOrder(authzLooks, orderLooks int) int { return 6 + authzLooks + orderLooks }

// The curve's looks, as a table: 25 ms after the challenge's answer (10 ms after
// the finalize), then every 100 ms until 400 ms, then each gap a quarter of the time
// waited, never more than 10 s. Guards against a pace that leaves a cliff (the
// previous one: nothing between 100 ms and 1 s).
func TestPoll_TheCurvesLooks(t *testing.T) {
	t.Parallel()
	p := newPoll(authzFirstLook)
	var got []time.Duration
	for at := p.start; len(got) < 12; {
		at = at.Add(p.next(at, 0))
		got = append(got, at.Sub(p.start))
	}
	require.Equal(t, []time.Duration{25 * ms, 125 * ms, 225 * ms, 325 * ms, 425 * ms, 531250 * time.Microsecond,
		664062500, 830078125, 1037597656, 1296997070, 1621246337, 2026557921}, got)
	p = newPoll(orderFirstLook)
	require.Equal(t, 10*ms, p.next(p.start, 0))
	require.Equal(t, 100*ms, p.next(p.start.Add(10*ms), 0))
}

// Wherever in the first minutes the CA finishes, the next look comes at most
// max(100 ms, a quarter of the time waited by then) later. Guards the bound itself
// against a change of the terms.
func TestPoll_OvershootIsBounded(t *testing.T) {
	t.Parallel()
	for _, first := range []time.Duration{authzFirstLook, orderFirstLook} {
		for ready := first + 1; ready < 3*time.Minute; ready += ready/50 + 1 {
			at := first
			for at < ready {
				at = lookAfter(at)
			}
			require.LessOrEqual(t, at-ready, max(pollStep, ready/pollShare), "ready at %s, seen at %s", ready, at)
		}
	}
	require.Equal(t, time.Minute+pollMax, lookAfter(time.Minute), "a gap is never more than pollMax")
}

// The CA's Retry-After is followed, capped at pollMax, and the curve goes on from
// there; a look that comes late (a slow answer) makes the next one due at once, not
// a gap after the answer.
func TestPoll_RetryAfterAndLateLooks(t *testing.T) {
	t.Parallel()
	p := newPoll(authzFirstLook)
	require.Equal(t, 3*time.Second, p.next(p.start, 3*time.Second))
	require.Equal(t, 750*ms, p.next(p.start.Add(3*time.Second), 0), "a quarter of the 3 s waited")
	require.Equal(t, pollMax, p.next(p.start.Add(4*time.Second), time.Hour))

	p = newPoll(authzFirstLook)
	require.Equal(t, 25*ms, p.next(p.start, 0))
	require.Equal(t, time.Duration(0), p.next(p.start.Add(300*ms), 0), "the look due at 125 ms is late")
	require.Equal(t, 100*ms, p.next(p.start.Add(300*ms), 0), "then 100 ms after it")
}

// The requests an order sends at a CA that says nothing of when to look and issues
// at once after the finalize, by how long its validation takes: the curve against
// the schedule before it. At 1 s the curve costs 6 requests more than before (the
// bound leaves no fewer: looks every 100 ms until 400 ms, then four growths of a
// quarter to reach 1 s); at 5 s, 11 more. docs/internals.md has this table.
func TestPoll_RequestsPerOrder(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		validation          time.Duration
		curve, before       int
		curveLook, prevLook [2]int
	}{
		{0, 8, 8, [2]int{1, 1}, [2]int{1, 1}},
		{100 * ms, 9, 9, [2]int{2, 1}, [2]int{2, 1}},
		{time.Second, 16, 10, [2]int{9, 1}, [2]int{3, 1}},
		{5 * time.Second, 24, 13, [2]int{17, 1}, [2]int{6, 1}},
	} {
		a, o := looksUntil(authzFirstLook, c.validation), looksUntil(orderFirstLook, 0)
		pa, po := previousLooks(c.validation, 0)
		t.Logf("validation %s: curve %d requests (%d + %d looks), before %d (%d + %d)",
			c.validation, requestsPerOrder(a, o), a, o, requestsPerOrder(pa, po), pa, po)
		require.Equal(t, c.curveLook, [2]int{a, o}, "%s", c.validation)
		require.Equal(t, c.prevLook, [2]int{pa, po}, "%s", c.validation)
		require.Equal(t, c.curve, requestsPerOrder(a, o))
		require.Equal(t, c.before, requestsPerOrder(pa, po))
	}
}
