package acme

import (
	"net"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// Misses whose clocks were read out of order (one descheduled between reading the
// clock and taking its turn, as on a busy machine) still get turns at least 1/50 s
// apart. Each call here is given a time 15 ms before the latest one given so far,
// every other time, and its turn counts from the latest (the real time it reached
// the limiter is at least that). The limiter takes an earlier time as its last call's
// and counts the time between again: turns came 10 ms apart, and the look-ups went
// over their 50 a second (251 in 5.0 s beside a CPU hog).
func TestLookupTurn_ClocksReadOutOfOrderGetNoExtraTurns(t *testing.T) {
	t.Parallel()
	r := &Responder{lookups: rate.NewLimiter(DefaultLookupsPerSecond, 1)}
	t0 := time.Now()
	latest := t0
	var turns []time.Time
	for i := range 200 {
		at := t0.Add(time.Duration(i) * 5 * time.Millisecond)
		if i%2 == 1 {
			at = at.Add(-15 * time.Millisecond)
		}
		if at.After(latest) {
			latest = at
		}
		if delay, ok := r.lookupTurn(at); ok {
			turns = append(turns, latest.Add(delay))
		}
	}
	slices.SortFunc(turns, func(a, b time.Time) int { return a.Compare(b) })
	require.Greater(t, len(turns), 10)
	gap := time.Second / DefaultLookupsPerSecond
	for i := 1; i < len(turns); i++ {
		// durationFromTokens truncates to the nanosecond.
		require.GreaterOrEqual(t, turns[i].Sub(turns[i-1]), gap-time.Microsecond,
			"turns %d and %d of %d", i-1, i, len(turns))
	}
}

// Packets from one prefix whose arrival times reach the limiter out of order get no
// more answers than the rate allows over the times given: here every other packet
// says it arrived half a second before the one before it, and the limiter, taking
// that as its last time, counted the half second again at the next packet: all 100
// were answered where the bucket holds 10 and refills 5 in half a second.
func TestRRL_ArrivalsOutOfOrderGetNoExtraAnswers(t *testing.T) {
	t.Parallel()
	const perSecond = 10
	l := newRateLimiter(perSecond, 0, nil)
	from := &net.UDPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 5353}
	t1 := time.Now()
	answered := 0
	for i := range 100 {
		at := t1
		if i%2 == 1 {
			at = t1.Add(-500 * time.Millisecond)
		}
		if l.verdict(from, at) == rrlAnswer {
			answered++
		}
	}
	require.LessOrEqual(t, answered, perSecond+perSecond/2, "answers for times spanning half a second")
}
