package worker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/listener"
)

// A pass woken by a notification or by the poll claims from the rows in line as they
// stand: a row held out of line whose backoff has run out is not brought back by it. The pass
// after one that found something due it did not claim brings held rows back first,
// whatever woke it, so that wake-ups coming faster than the timer's retry (each pass
// sets the timer again) cannot hold a retry off; a refill does once every
// returnHeldEvery. Guards against a notification's pass, or each refill of a full
// queue, running the statement bringing held rows back (a round trip, most of it
// planning, before the claim; at rest, the poll's every 30 s on every instance), and
// against a held row left out for as long as notifications keep coming.
func TestClaim_ANotificationsPassClaimsInLineAndTheNextAfterADueRowBringsHeldRowsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	tenant := pgtest.Tenant(t, pool)
	var id string
	require.NoError(t, pool.QueryRow(ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
VALUES ($1, 'held.example', 'verified', 'tok', 'pending', 'acme') RETURNING id::text`, tenant).Scan(&id))
	// Failed an hour ago, its backoff long over, still held out of line.
	_, err := pool.Exec(ctx, `UPDATE proxy_domains SET ssl_held = 'backoff', ssl_attempts = 1,
        ssl_last_attempt_at = now() - interval '1 hour' WHERE id = $1`, id)
	require.NoError(t, err)

	w, err := New(Config{Pool: pool, Issuer: fakeissuer.New(1), Log: zap.NewNop(), Owner: "test",
		Directory: "https://ca.invalid/directory", Concurrency: 4, PollInterval: time.Hour})
	require.NoError(t, err)
	w.timer = time.NewTimer(time.Hour)
	w.timer.Stop()

	claims, _, _, _ := w.claim(ctx, 4, listener.SourceNotify)
	require.Empty(t, claims, "a notification's pass brought a held row back")
	claims, _, _, _ = w.claim(ctx, 4, listener.SourcePoll)
	require.Empty(t, claims, "the poll's pass brought a held row back")
	w.schedule(ctx, listener.SourceNotify, 0)
	claims, _, _, _ = w.claim(ctx, 4, listener.SourceNotify)
	require.Len(t, claims, 1, "the pass after one that found the row due did not bring it back")
	require.Equal(t, id, claims[0].ID)

	// A refill brings held rows back once every returnHeldEvery, not before each of
	// the claims that follow finished orders while the queue stays full.
	_, err = pool.Exec(ctx, `UPDATE proxy_domains SET ssl_status = 'pending', ssl_held = 'backoff',
        ssl_last_attempt_at = now() - interval '1 hour' WHERE id = $1`, id)
	require.NoError(t, err)
	claims, _, _, _ = w.claim(ctx, 4, listener.SourceRefill)
	require.Empty(t, claims, "a refill brought held rows back again within returnHeldEvery")
	w.heldReturnedAt = time.Now().Add(-returnHeldEvery)
	claims, _, _, _ = w.claim(ctx, 4, listener.SourceRefill)
	require.Len(t, claims, 1, "a refill after returnHeldEvery did not bring the held row back")
}

// The announced commits a worker keeps for its next look are bounded, newest kept,
// and their looks back off from wakeRetry by doubling up to the poll interval.
// Guards against a saturated worker, which schedules no look, growing the list with
// every commit, and against a look every 5 ms for as long as a commit stays unseen.
func TestUnseen_KeepsTheNewestAndBacksOff(t *testing.T) {
	t.Parallel()
	w := &Worker{cfg: Config{PollInterval: 40 * time.Millisecond}}
	for x := range uint32(maxUnseen + 3) {
		w.addUnseen([]uint32{x})
	}
	require.Len(t, w.unseen, maxUnseen)
	require.Equal(t, uint32(3), w.unseen[0])
	require.Equal(t, uint32(maxUnseen+2), w.unseen[len(w.unseen)-1])

	var got []time.Duration
	for range 5 {
		got = append(got, w.nextUnseenRetry())
	}
	require.Equal(t, []time.Duration{5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond,
		40 * time.Millisecond, 40 * time.Millisecond}, got)

	w.keepUnseen(nil)
	w.addUnseen([]uint32{7})
	require.Equal(t, wakeRetry, w.nextUnseenRetry(), "a new unseen commit starts the curve over")
}

// The heartbeat reads the orders in flight, and an order's last write clears its
// token before the loop forgets the order. A heartbeat in between found the token
// gone and logged "claim lost" for an order that had just ended its own claim, and
// marked it lost, which turned a retry of that write (its answer lost) into a "lost"
// outcome. An order writing its result is left to that write, which its token fences;
// one that is not is still stopped at once.
func TestRenewLeases_AnOrderWritingItsResultIsNotTakenForLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	tenant := pgtest.Tenant(t, pool)
	core, logs := observer.New(zap.DebugLevel)
	w, err := New(Config{Pool: pool, Issuer: fakeissuer.New(1), Log: zap.New(core), Owner: "test",
		Directory: "https://ca.invalid/directory", Concurrency: 4, PollInterval: time.Hour})
	require.NoError(t, err)
	w.timer = time.NewTimer(time.Hour)
	w.timer.Stop()
	defer w.hb.close()

	for _, finishing := range []bool{true, false} {
		name := fmt.Sprintf("finishing-%v.example", finishing)
		pgtest.Domain(t, pool, tenant, name)
		claims, _, _, _ := w.claim(ctx, 1, listener.SourcePoll)
		require.Len(t, claims, 1)
		var cause error
		o := &order{claim: claims[0], cancel: func(err error) { cause = err }}
		o.finishing.Store(finishing)
		w.orders.add(o)
		// The order's last write has committed: the claim is over, its token gone.
		require.NoError(t, w.q.Release(ctx, claims[0], true))

		w.renewLeases(ctx)
		// Counted over both rounds: the first, finishing, logs none.
		lost := logs.FilterMessage("claim lost: another instance or an operator took this domain; stopping the order").Len()
		if finishing {
			require.NoError(t, cause, "an order writing its result was stopped")
			require.False(t, o.lost.Load())
			require.Zero(t, lost)
		} else {
			require.ErrorIs(t, cause, errLost)
			require.True(t, o.lost.Load())
			require.Equal(t, 1, lost)
		}
		w.orders.remove(claims[0].Token)
	}
}
