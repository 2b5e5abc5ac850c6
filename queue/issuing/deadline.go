package issuing

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrLeaseDeadline: the claim's local deadline has passed. The order sends the CA
// nothing more; the worker hands the claim back uncharged.
var ErrLeaseDeadline = errors.New("the claim's lease deadline has passed: nothing more is sent to the CA for this order")

// LeaseMargin is what a claim's local deadline keeps back from the lease: a
// twentieth. It covers the database's and the instance's clocks running at different
// rates (NTP slews at most 500 ppm, 0.1% of the lease) fifty times over, for the
// scheduling delay between a check and a request leaving the host. No margin covers
// an unbounded pause: the database refuses to renew a lease that ran out, and every
// write is fenced by the claim token (docs/high-availability.md).
func LeaseMargin(lease time.Duration) time.Duration { return lease / 20 }

// Deadline is a claim's local deadline on this process's monotonic clock: the send
// time of the last successful lease renewal (at first, of the claim), plus the lease,
// minus LeaseMargin. Past it another instance may have reclaimed the row, and the
// order must send the CA nothing more. It moves only forward. A nil *Deadline is no
// deadline. Safe for concurrent use.
type Deadline struct {
	lease time.Duration
	life  time.Duration // lease minus margin

	mu sync.Mutex
	at time.Time // carries a monotonic reading: only time.Now() and Add make it

	// ended is cancelled by Expire: the deadline has passed whatever at says.
	ended  context.Context
	expire context.CancelFunc
}

// NewDeadline is the deadline of a claim whose statement was sent at sent (this
// process's time.Now(), taken before sending), under lease.
func NewDeadline(sent time.Time, lease time.Duration) *Deadline {
	d := &Deadline{lease: lease, life: lease - LeaseMargin(lease)}
	d.at = sent.Add(d.life)
	d.ended, d.expire = context.WithCancel(context.Background())
	return d
}

// Expire ends the deadline now, for good: Check fails and every context Bound made
// ends. The shutdown calls it before handing an order back, so the order cannot
// afterwards deactivate an authorization another instance's order reuses.
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

// Renewed moves the deadline to a lease from sent, a confirmed renewal's send time;
// it never moves back.
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

// Left is the time until the deadline (negative once passed), on the monotonic clock.
func (d *Deadline) Left() time.Duration { return time.Until(d.At()) }

// Check returns ErrLeaseDeadline once the deadline has passed, and nil before it or
// for a nil Deadline. An issuer calls it before every request to the CA.
func (d *Deadline) Check() error {
	if d == nil || d.Left() > 0 && d.ended.Err() == nil {
		return nil
	}
	return ErrLeaseDeadline
}

// Bound is ctx, ending with cause ErrLeaseDeadline when the deadline passes, as
// renewals have moved it by then. For a nil Deadline it is ctx. cancel releases its
// timer.
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
