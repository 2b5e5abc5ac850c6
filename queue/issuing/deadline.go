package issuing

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrLeaseDeadline: the claim's local deadline has passed (Deadline). The order it
// belongs to sends the CA nothing more; the worker hands the claim back, uncharged,
// once it reaches the database.
var ErrLeaseDeadline = errors.New("the claim's lease deadline has passed: nothing more is sent to the CA for this order")

// LeaseMargin is what a claim's local deadline keeps back from the lease: the
// deadline falls this long before the lease the database granted runs out, as the
// instance's own monotonic clock measures it. A twentieth of the lease (3 s of the
// default 60 s; 150 ms of a 3 s test lease).
//
// It covers the two clocks running at different rates, the only disagreement that
// matters: the database stamps the lease with its own clock, now() at the statement's
// start, which is after the instance sent it, and decides expiry with the same clock;
// the instance measures from the send on CLOCK_MONOTONIC, which time steps do not
// move. A clock disciplined by NTP is slewed by at most 500 ppm (the kernel's
// limit), so the two disagree by at most 0.1% of the lease. The margin is 50 times
// that, because it also has to cover the moment between the check before a request
// and its bytes leaving the host (a scheduling delay or a GC pause on a loaded
// host, milliseconds). A process stopped in that moment (SIGSTOP, a VM paused) can
// still send one request late: no margin covers an unbounded pause, which is why the
// database refuses to renew a lease that ran out and every write is fenced by the
// claim token.
func LeaseMargin(lease time.Duration) time.Duration { return lease / 20 }

// Deadline is a claim's local deadline, on this process's monotonic clock: the send
// time of the last lease renewal that succeeded (at first, of the claim itself), plus
// the lease, minus LeaseMargin. Until then no other instance can have reclaimed the
// row; after it, one may have, and the order must send the CA nothing more. It moves
// only forward. A nil *Deadline is no deadline (an issuer called outside the
// worker). Safe for concurrent use.
type Deadline struct {
	lease time.Duration
	life  time.Duration // lease minus margin

	mu sync.Mutex
	at time.Time // carries a monotonic reading: only time.Now() and Add make it

	// ended is cancelled by Expire: the deadline has passed whatever at says.
	ended  context.Context
	expire context.CancelFunc
}

// NewDeadline is the deadline of a claim whose statement was sent at sent (a
// time.Now() of this process, taken before the statement went out), under lease.
func NewDeadline(sent time.Time, lease time.Duration) *Deadline {
	d := &Deadline{lease: lease, life: lease - LeaseMargin(lease)}
	d.at = sent.Add(d.life)
	d.ended, d.expire = context.WithCancel(context.Background())
	return d
}

// Expire ends the deadline now, for good: no renewal moves it again, Check fails, and
// every context Bound made ends. The shutdown calls it on an order it hands back
// itself, before the hand-back commits: the order, still running, then sends the CA
// nothing more (a deactivation of its authorizations included), which after the
// hand-back could reach an authorization another instance's new order for the name
// reuses.
func (d *Deadline) Expire() {
	if d == nil {
		return
	}
	d.mu.Lock()
	if now := time.Now(); now.Before(d.at) {
		d.at = now
	}
	d.mu.Unlock()
	d.expire()
}

// Renewed moves the deadline to a lease from sent, the send time of a renewal the
// database confirmed; a renewal that answers late, or out of order, never moves it
// back.
func (d *Deadline) Renewed(sent time.Time) {
	at := sent.Add(d.life)
	d.mu.Lock()
	defer d.mu.Unlock()
	if at.After(d.at) && d.ended.Err() == nil {
		d.at = at
	}
}

// Lease is the lease the deadline runs on.
func (d *Deadline) Lease() time.Duration { return d.lease }

// At is the deadline now.
func (d *Deadline) At() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.at
}

// Left is the time until the deadline (negative once passed). Measured on the
// monotonic clock: a wall-clock step changes nothing.
func (d *Deadline) Left() time.Duration { return time.Until(d.At()) }

// Check returns ErrLeaseDeadline once the deadline has passed, and nil before it or
// for a nil Deadline. An issuer calls it before every request to the CA.
func (d *Deadline) Check() error {
	if d == nil || d.Left() > 0 && d.ended.Err() == nil {
		return nil
	}
	return ErrLeaseDeadline
}

// Bound is ctx, ending when the deadline passes with ErrLeaseDeadline as its cause.
// It follows the deadline as renewals move it, so a wait bounded by it (a request to
// the CA, the whole order) ends at the deadline as it stands then, not as it stood
// when the wait began. For a nil Deadline it is ctx. cancel releases its timer.
func (d *Deadline) Bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if d == nil {
		return context.WithCancel(ctx)
	}
	bounded, cancel := context.WithCancelCause(ctx)
	var mu sync.Mutex // guards t and done against the timer's own goroutine
	var t *time.Timer
	done := false
	check := func() {
		left := d.Left()
		mu.Lock()
		defer mu.Unlock()
		switch {
		case done:
		case left > 0:
			t.Reset(left) // renewed since the timer was set
		default:
			cancel(ErrLeaseDeadline)
		}
	}
	mu.Lock()
	t = time.AfterFunc(d.Left(), check)
	mu.Unlock()
	stopExpired := context.AfterFunc(d.ended, func() { cancel(ErrLeaseDeadline) })
	return bounded, func() {
		mu.Lock()
		done = true
		t.Stop()
		mu.Unlock()
		stopExpired()
		cancel(context.Canceled)
	}
}
